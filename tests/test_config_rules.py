"""The DeepSpeed/YAML rules on real config files (fix: test_cli_fix.py; the readers:
test_runconfig_readers.py)."""

import json


from mgft_doctor.catalog import load_catalog
from mgft_doctor.runconfig import codes, load_run_config
from mgft_doctor.runconfig import ds_rules as dsconfig_rules

Z3_AUTO = {
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "overlap_comm": False, "reduce_bucket_size": "auto",
                          "stage3_gather_16bit_weights_on_model_save": True},
}


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data, indent=2) if name.endswith(".json") else data)
    return str(p)


def codes_of(problems):
    return [p.code for p in problems]


def test_every_problem_carries_a_catalog_code():
    """Each Problem(...) of the run rules names a constant of runconfig/codes.py, and each of those is
    a catalog entry: a rule can never send the user to a missing page."""
    import ast
    import inspect

    from mgft_doctor.runconfig import quantization

    known = {e.code for e in load_catalog()}
    table = {k: v for k, v in vars(codes).items() if k.isupper()}
    assert table and {k: v for k, v in table.items() if v not in known} == {}
    first_args = [node.args[0] for module in (dsconfig_rules, quantization)
                  for node in ast.walk(ast.parse(inspect.getsource(module)))
                  if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Problem"]
    assert len(first_args) >= 14
    named = [a.attr for a in first_args if isinstance(a, ast.Attribute) and getattr(a.value, "id", None) == "codes"]
    assert len(named) == len(first_args) and set(named) <= set(table), ast.dump(first_args[0])


def test_auto_is_fine_under_llamafactory_but_flagged_alone(tmp_path):
    ds = write(tmp_path, "ds_z3.json", Z3_AUTO)
    yml = write(tmp_path, "train.yaml", f"model_name_or_path: x\nstage: sft\ndeepspeed: {ds}\n"
                                        "per_device_train_batch_size: 2\ngradient_accumulation_steps: 4\nbf16: true\n")
    assert dsconfig_rules.check(load_run_config(yml), 2, True) == []
    alone = dsconfig_rules.check(load_run_config(ds), 2, True)
    assert codes_of(alone) == [codes.DS_AUTO_OUTSIDE_TRAINER] and alone[0].severity == "warn"
    assert "train_batch_size" in alone[0].paths and "zero_optimization.reduce_bucket_size" in alone[0].paths


def test_batch_arithmetic_alone_and_against_yaml(tmp_path):
    ds = write(tmp_path, "ds.json", {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2,
                                      "gradient_accumulation_steps": 18, "zero_optimization": {"stage": 2}})
    probs = dsconfig_rules.check(load_run_config(ds), 7, None)
    assert codes_of(probs) == [codes.DS_BATCH_ARITHMETIC] and "256" in probs[0].message and "252" in probs[0].message
    ok = write(tmp_path, "ok.json", {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2,
                                      "gradient_accumulation_steps": 16, "zero_optimization": {"stage": 2}})
    assert dsconfig_rules.check(load_run_config(ok), 8, None) == []
    yml = write(tmp_path, "t.yaml", f"deepspeed: {ds}\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 18\n")
    probs = dsconfig_rules.check(load_run_config(yml), 7, None)
    assert codes.DS_HF_MISMATCH in codes_of(probs)


def test_precision_and_zero_sections(tmp_path):
    ds = write(tmp_path, "ds.json", {"fp16": {"enabled": True}, "bf16": {"enabled": True},
                                      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})
    probs = dsconfig_rules.check(load_run_config(ds), 2, False)
    ks = codes_of(probs)
    assert ks.count(codes.DS_CONFIG_INVALID) == 2  # fp16+bf16, nvme without nvme_path
    assert codes.BF16_UNSUPPORTED in ks and codes.ZERO3_EMPTY_SAVE in ks


def test_huge_ddp_timeout_and_missing_ds_file(tmp_path):
    yml = write(tmp_path, "t.yaml", "deepspeed: examples/deepspeed/nope.json\nddp_timeout: 180000000\n")
    probs = dsconfig_rules.check(load_run_config(yml), 2, None)
    assert set(codes_of(probs)) == {codes.DS_CONFIG_INVALID, codes.NCCL_WATCHDOG_TIMEOUT}


def test_ds_path_resolved_like_llamafactory(tmp_path, monkeypatch):
    root = tmp_path / "LLaMA-Factory"
    (root / "examples" / "deepspeed").mkdir(parents=True)
    (root / "examples" / "train_lora").mkdir(parents=True)
    (root / "examples" / "deepspeed" / "ds_z3_config.json").write_text(json.dumps(Z3_AUTO))
    yml = root / "examples" / "train_lora" / "sft.yaml"
    yml.write_text("deepspeed: examples/deepspeed/ds_z3_config.json\n")
    monkeypatch.chdir(tmp_path)  # not the LLaMA-Factory root: found through the YAML's parents
    rc = load_run_config(str(yml))
    assert rc.ds is not None and rc.zero_stage == 3
