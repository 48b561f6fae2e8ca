"""A LLaMA-Factory YAML and its DeepSpeed JSON that the HF Trainer or accelerate refuse at
start-up (precision, batch sizes, clipping, optimizer and scheduler fields, no ZeRO section):
config.deepspeed's rules (ds_rules.trainer_mismatches, accelerate_checks, batch_arithmetic) on
each pair, and the real libraries on the same files (tests/runconfig_oracle.py: LLaMA-Factory's
get_train_args, then HfTrainerDeepSpeedConfig process + finalize and accelerate's DeepSpeedPlugin
in the Trainer's order). Every planted pair fails in the library with the message our finding
quotes; every near-miss passes both."""

from __future__ import annotations

import copy
import json

import pytest

from mgft_doctor.runconfig import codes, ds_rules, load_run_config

BASE_YAML = """\
model_name_or_path: model
stage: sft
do_train: true
finetuning_type: lora
dataset: tiny
template: qwen
output_dir: out
report_to: none
deepspeed: ds.json
"""
# LLaMA-Factory's examples/deepspeed/ds_z2_config.json
BASE_DS = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
           "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                    "hysteresis": 2, "min_loss_scale": 1},
           "bf16": {"enabled": "auto"},
           "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 5e8,
                                 "overlap_comm": False, "reduce_scatter": True, "reduce_bucket_size": 5e8,
                                 "contiguous_gradients": True, "round_robin_gradients": True}}
ADAMW = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
WARMUP = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                               "warmup_num_steps": "auto", "total_num_steps": "auto"}}

# name -> (YAML lines added, JSON changes (dotted path -> value; None deletes), our code or None,
#          what the library says: a piece of its message, or None when it accepts the pair)
PAIRS = {
    "bf16_json_only": ("", {"bf16.enabled": True}, codes.DS_HF_MISMATCH,
                       "- ds bf16.enabled=True vs hf bf16|bf16_full_eval=False"),
    "bf16_both": ("bf16: true\n", {"bf16.enabled": True}, None, None),
    "pure_bf16_is_not_bf16": ("pure_bf16: true\n", {"bf16.enabled": True}, codes.DS_HF_MISMATCH,
                              "- ds bf16.enabled=True vs hf bf16|bf16_full_eval=False"),
    "yaml_bf16_json_fp16": ("bf16: true\n", {"fp16.enabled": True}, codes.DS_MIXED_PRECISION,
                            "`--mixed_precision` arg cannot be set to `bf16` when `fp16` is set in the DeepSpeed config file."),
    "yaml_bf16_json_fp16_off": ("bf16: true\n", {"fp16.enabled": False}, None, None),
    "yaml_fp16_json_fp16_off": ("fp16: true\n", {"fp16.enabled": False}, codes.DS_HF_MISMATCH,
                                "- ds fp16.enabled=False vs hf fp16|fp16_full_eval=True"),
    "clipping": ("", {"gradient_clipping": 0.5}, codes.DS_HF_MISMATCH, "- ds gradient_clipping=0.5 vs hf max_grad_norm=1.0"),
    "clipping_same": ("max_grad_norm: 0.5\n", {"gradient_clipping": 0.5}, None, None),
    "lr": ("learning_rate: 1.0e-4\n", {"optimizer": dict(ADAMW, params=dict(ADAMW["params"], lr=3e-5))},
           codes.DS_HF_MISMATCH, "- ds optimizer.params.lr=3e-05 vs hf learning_rate=0.0001"),
    # PyYAML reads `3e-5` as a string; llamafactory-cli (OmegaConf) as the float the JSON holds
    "lr_same_written_3e-5": ("learning_rate: 3e-5\n", {"optimizer": dict(ADAMW, params=dict(ADAMW["params"], lr=3e-5))},
                             None, None),
    "betas_eps_decay": ("weight_decay: 0.1\n", {"optimizer": {"type": "AdamW", "params": {
        "lr": "auto", "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.0}}}, codes.DS_HF_MISMATCH,
        "- ds optimizer.params.betas=[0.9, 0.95] vs hf adam_beta1+adam_beta2=[0.9, 0.999]"),
    "betas_same": ("adam_beta2: 0.95\n", {"optimizer": {"type": "AdamW", "params": {
        "lr": "auto", "betas": [0.9, 0.95], "eps": "auto", "weight_decay": "auto"}}}, None, None),
    "scheduler_steps": ("max_steps: 10\nwarmup_steps: 2\n", {"optimizer": ADAMW, "scheduler": {
        "type": "WarmupDecayLR", "params": dict(WARMUP["params"], total_num_steps=1000, warmup_num_steps=100)}},
        codes.DS_HF_MISMATCH, "- ds scheduler.params.total_num_steps=1000 vs hf num_training_steps (calculated)=10"),
    "scheduler_steps_same": ("max_steps: 10\nwarmup_steps: 2\n", {"optimizer": ADAMW, "scheduler": {
        "type": "WarmupDecayLR", "params": dict(WARMUP["params"], total_num_steps=10, warmup_num_steps=2)}}, None, None),
    "warmup_max_lr": ("learning_rate: 2.0e-5\n", {"optimizer": ADAMW, "scheduler": {
        "type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": 1e-4, "warmup_num_steps": "auto"}}},
        codes.DS_HF_MISMATCH, "- ds scheduler.params.warmup_max_lr=0.0001 vs hf learning_rate=2e-05"),
    "no_zero_section": ("", {"zero_optimization": None}, codes.DS_NO_ZERO_SECTION,
                        "Please specify the ZeRO optimization config in the DeepSpeed config."),
    "zero_stage_0": ("", {"zero_optimization": {"stage": 0}}, None, None),
    # TrainingArguments' per_device_train_batch_size default is 8, not 1
    "micro_batch_default_8": ("", {"train_micro_batch_size_per_gpu": 8}, None, None),
    "micro_batch_4_vs_default": ("", {"train_micro_batch_size_per_gpu": 4}, codes.DS_HF_MISMATCH,
                                 "- ds train_micro_batch_size_per_gpu=4 vs hf per_device_train_batch_size=8"),
    "accumulation": ("gradient_accumulation_steps: 4\n", {"gradient_accumulation_steps": 8}, codes.DS_HF_MISMATCH,
                     "- ds gradient_accumulation_steps=8 vs hf gradient_accumulation_steps=4"),
    "train_batch": ("per_device_train_batch_size: 2\ngradient_accumulation_steps: 4\n", {"train_batch_size": 16},
                    codes.DS_HF_MISMATCH, "- ds train_batch_size=16 vs hf train_batch_size (calculated)=8"),
    "train_batch_same": ("per_device_train_batch_size: 2\ngradient_accumulation_steps: 4\n", {"train_batch_size": 8},
                         None, None),
}


def _json(changes: dict) -> dict:
    ds = copy.deepcopy(BASE_DS)
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = ds
        for k in parents:
            node = node.setdefault(k, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return ds


def write_pair(folder, name: str):
    yaml_lines, changes, _, _ = PAIRS[name]
    case = folder / name
    (case / "model").mkdir(parents=True, exist_ok=True)
    (case / "model" / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    (case / "ds.json").write_text(json.dumps(_json(changes), indent=1))
    (case / "t.yaml").write_text(BASE_YAML + yaml_lines)
    return case


def our_codes(case) -> list[str]:
    rc = load_run_config(str(case / "t.yaml"))
    return [p.code for p in ds_rules.check(rc, 1, True) if p.severity == "fail"]


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_rules_on_each_pair(tmp_path, name):
    _, _, code, said = PAIRS[name]
    got = our_codes(write_pair(tmp_path, name))
    if code is None:
        assert got == [], got
        return
    assert got and got[0] == code, got
    rc = load_run_config(str(tmp_path / name / "t.yaml"))
    messages = " ".join(p.message for p in ds_rules.check(rc, 1, True))
    assert said in messages  # the library's own words, quoted


def test_mismatches_are_one_finding_with_every_line_as_the_trainer_prints_them(tmp_path):
    case = write_pair(tmp_path, "betas_eps_decay")
    rc = load_run_config(str(case / "t.yaml"))
    found = [p for p in ds_rules.trainer_mismatches(rc, 1, True)]
    assert len(found) == 1 and found[0].code == codes.DS_HF_MISMATCH
    assert ("- ds optimizer.params.eps=1e-06 vs hf adam_epsilon=1e-08\n"
            "- ds optimizer.params.weight_decay=0.0 vs hf weight_decay=0.1") in found[0].message
    assert found[0].message.count("Please correct the following DeepSpeed config values") == 1


def test_steps_the_yaml_does_not_decide_are_a_warning(tmp_path):
    """Without max_steps the Trainer computes the steps from the dataset: a fixed total_num_steps is
    checked against a number the doctor cannot know."""
    yaml_lines, changes, _, _ = PAIRS["scheduler_steps_same"]
    PAIRS["_epochs"] = ("num_train_epochs: 3\nwarmup_steps: 2\n", changes, None, None)
    try:
        case = write_pair(tmp_path, "_epochs")
    finally:
        del PAIRS["_epochs"]
    found = ds_rules.trainer_mismatches(load_run_config(str(case / "t.yaml")), 1, True)
    assert [p.severity for p in found] == ["warn"] and "total_num_steps" in found[0].message


def test_a_json_alone_is_not_held_against_trainer_arguments(tmp_path):
    case = write_pair(tmp_path, "clipping")
    rc = load_run_config(str(case / "ds.json"))
    assert ds_rules.trainer_mismatches(rc, 1, True) == [] and ds_rules.accelerate_checks(rc, 1, True) == []


@pytest.mark.slow
def test_the_libraries_refuse_every_planted_pair_and_accept_every_near_miss(tmp_path):
    from runconfig_oracle import ask

    cases = {}
    for name in PAIRS:
        case = write_pair(tmp_path, name)
        cases[name] = {"mode": "pair", "yaml": str(case / "t.yaml"), "ds": str(case / "ds.json"), "cwd": str(case)}
    got = ask(cases, tmp_path)
    for name, (_, _, code, said) in PAIRS.items():
        if said is None:
            assert got[name]["ok"], (name, got[name])
        else:
            assert not got[name]["ok"] and got[name]["type"] == "ValueError", (name, got[name])
            assert said in got[name]["msg"], (name, got[name]["msg"])
        assert (our_codes(tmp_path / name) != []) == (said is not None), name


def repaired_pair(folder, name: str):
    """The pair after `mgft-doctor fix`'s safe repairs (ds_rules.plan_repairs, unsafe=False), written
    beside the original as fixed.json with the YAML pointing at it."""
    case = write_pair(folder, name)
    plan = ds_rules.plan_repairs(load_run_config(str(case / "t.yaml")), 1, True)
    (case / "fixed.json").write_text(json.dumps(plan.deepspeed, indent=1))
    (case / "fixed.yaml").write_text((case / "t.yaml").read_text().replace("deepspeed: ds.json", "deepspeed: fixed.json"))
    return case, plan


# every pair the Trainer or accelerate refuse for a disagreement with the YAML has a safe repair: "auto"
REPAIRABLE = sorted(n for n, (_, _, code, _) in PAIRS.items() if code in (codes.DS_HF_MISMATCH, codes.DS_MIXED_PRECISION))


@pytest.mark.parametrize("name", REPAIRABLE)
def test_each_disagreement_has_a_safe_repair_to_auto_that_leaves_nothing(tmp_path, name):
    case, plan = repaired_pair(tmp_path, name)
    assert plan.applied and all(p.safe for p in plan.applied), [(p.code, p.label) for p in plan.manual + plan.held_back]
    assert not [p for p in plan.manual + plan.held_back if p.code in (codes.DS_HF_MISMATCH, codes.DS_MIXED_PRECISION)]
    changed = [path for p in plan.applied for path in p.paths]
    assert changed and all(ds_rules._get(plan.deepspeed, path) == "auto" for path in changed), changed
    assert our_codes_of(case / "fixed.yaml") == []


def our_codes_of(yaml_path) -> list[str]:
    return [p.code for p in ds_rules.check(load_run_config(str(yaml_path)), 1, True) if p.severity == "fail"]


def test_the_repair_is_offered_by_check_and_applied_by_fix(tmp_path):
    """The finding says how (`mgft-doctor fix`), and the command writes "auto" into the JSON only."""
    import subprocess
    import sys

    case = write_pair(tmp_path, "betas_eps_decay")
    found = ds_rules.trainer_mismatches(load_run_config(str(case / "t.yaml")), 1, True)
    assert found[0].safe and "[safe repair: mgft-doctor fix" in ds_rules.check(load_run_config(str(case / "t.yaml")), 1, True)[0].fix
    yaml_before = (case / "t.yaml").read_text()
    out = subprocess.run([sys.executable, "-m", "mgft_doctor", "fix", "--write", "--world-size", "1",
                          str(case / "t.yaml")], capture_output=True,
                         text=True, timeout=120, cwd=str(case))
    assert out.returncode in (0, 1), out.stdout + out.stderr
    ds = json.loads((case / "ds.json").read_text())
    assert ds["optimizer"]["params"] == {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}, out.stdout
    assert (case / "t.yaml").read_text() == yaml_before


@pytest.mark.slow
def test_the_libraries_accept_every_repaired_pair(tmp_path):
    """transformers' HfTrainerDeepSpeedConfig (process + finalize) and accelerate's DeepSpeedPlugin on
    each safely repaired pair: the Trainer fills the "auto" from the YAML and starts."""
    from runconfig_oracle import ask

    cases = {}
    for name in REPAIRABLE:
        case, _ = repaired_pair(tmp_path, name)
        cases[name] = {"mode": "pair", "yaml": str(case / "fixed.yaml"), "ds": str(case / "fixed.json"), "cwd": str(case)}
    got = ask(cases, tmp_path)
    assert {n: r for n, r in got.items() if not r["ok"]} == {}
