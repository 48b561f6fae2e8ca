"""The config readers (runconfig/__init__.py, reading.py, model_config.py) on bad shapes and hostile
files: each is one line naming the file and the key path (exit 2 from the CLI), never a crash, a
hang or gigabytes of memory."""

import json
import os
import subprocess
import sys
import time

import pytest

from mgft_doctor.errors import InputError
from mgft_doctor.runconfig import load_run_config, read_ds_json, read_yaml
from mgft_doctor.runconfig.model_config import load_model_config, missing_model
from mgft_doctor.runconfig.reading import MAX_CONFIG_BYTES


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text if isinstance(text, str) else json.dumps(text))
    return str(p)


def error_of(fn, *args) -> str:
    with pytest.raises(InputError) as exc:
        fn(*args)
    text = str(exc.value)
    assert "\n" not in text and len(text) < 400, text
    return text


@pytest.mark.parametrize("ds, words", [
    ({"zero_optimization": [1, 2]}, "zero_optimization: expected a mapping, got a list"),
    ({"zero_optimization": {"offload_optimizer": 3.5}}, "zero_optimization.offload_optimizer: expected a mapping, got a number"),
    ({"bf16": "yes"}, "bf16: expected a mapping, got a string ('yes')"),
    ({"train_batch_size": "many"}, "train_batch_size: expected a number from 1 to"),
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu: 0 is out of range"),
    ({"gradient_accumulation_steps": [4]}, "gradient_accumulation_steps: expected a number"),
    ({"optimizer": {"params": []}}, "optimizer.params: expected a mapping, got a list"),
    ({"zero_optimization": {"offload_param": {"device": {"x": 1}}}}, "zero_optimization.offload_param.device: expected a string"),
    ({"a": {"b": [0, 2 ** 70]}}, "a.b[1]: 1180591620717411303424 is out of range"),
])
def test_ds_json_bad_shapes_name_the_key_path(tmp_path, ds, words):
    path = write(tmp_path, "ds.json", ds)
    assert error_of(read_ds_json, path) == f"{path}: {words}" or words in error_of(read_ds_json, path)


@pytest.mark.parametrize("text, words", [
    ('{"gradient_clipping": NaN}', "gradient_clipping: nan is not a finite number"),
    ('{"gradient_clipping": Infinity}', "gradient_clipping: inf is not a finite number"),
    ('{"x": {"y": 1e400}}', "x.y: inf is not a finite number"),
    ('{"x": 1' + "0" * 5000 + "}", "digits"),
    ("[" * 100000 + "]" * 100000, "nested more than"),
    ('{"a": 1, "a": 2}', "duplicate key 'a'"),
    ("[1, 2]", "a DeepSpeed config must be a JSON object, got a list"),
])
def test_ds_json_numbers_nesting_and_top_level(tmp_path, text, words):
    assert words in error_of(read_ds_json, write(tmp_path, "ds.json", text))


@pytest.mark.parametrize("text, words", [
    ("learning_rate: .inf\n", "learning_rate: inf is not a finite number"),
    ("ddp_timeout: .nan\n", "ddp_timeout: nan is not a finite number"),
    ("per_device_train_batch_size: [1]\n", "per_device_train_batch_size: expected a whole number from 1 to"),
    ("cutoff_len: -5\n", "cutoff_len: -5 is out of range"),
    ("model_name_or_path: {a: 1}\n", "model_name_or_path: expected a file path (a string), got a mapping"),
    ("deepspeed: " + "x" * 5000 + "\n", "deepspeed: a path of 5,000 characters is too long"),
    ("- a\n- b\n", "must be a mapping of keys, got a list"),
    ("1: x\n", "key 1 is not a string"),
    ("a: 1\na: 2\n", "found duplicate key a"),
    ("x: !!python/object/apply:os.system [echo hi]\n", "not valid YAML"),
    ("x: !custom 3\n", "not valid YAML"),
    ("x: !!set {a, b}\n", "x: a set is not a plain value"),
    ("x: !!binary aGk=\n", "x: a bytes is not a plain value"),
    ("a: " + "[" * 100000 + "]" * 100000 + "\n", "nest"),
    ("a: " + "[" * 200 + "]" * 200 + "\n", "line 1: nested more than 64 levels deep"),
    ("a: &a [*a]\n", "a YAML alias that contains itself"),
])
def test_yaml_bad_shapes_tags_and_nesting(tmp_path, text, words):
    assert words in error_of(read_yaml, write(tmp_path, "train.yaml", text))


def test_yaml_reads_as_llamafactory_does(tmp_path):
    """OmegaConf's rules (llamafactory-cli reads with them): 1e-4 is a float, a date a string."""
    y = read_yaml(write(tmp_path, "t.yaml", "learning_rate: 1e-4\nrun_name: 2024-01-01\nbf16: true\n"))
    assert y == {"learning_rate": 1e-4, "run_name": "2024-01-01", "bf16": True}


# what LLaMA-Factory's get_train_args takes unchanged (the slow test below runs it): the reader lets
# each through as it is, and config.llamafactory judges it (MGD918: a quoted number, a float in an int)
LF_TAKES = {
    "quoted_batch": ("per_device_train_batch_size: '4'\n", "4"),
    "quoted_accumulation": ("gradient_accumulation_steps: '2'\n", "2"),
    "quoted_cutoff": ("cutoff_len: '64'\n", "64"),
    "quoted_rank": ("lora_rank: '8'\n", "8"),
    "quoted_bits": ("quantization_bit: '4'\n", "4"),
    "quoted_timeout": ("ddp_timeout: '1800'\n", "1800"),
    "quoted_clipping": ("max_grad_norm: '1.0'\n", "1.0"),
    "quoted_steps": ("max_steps: '10'\n", "10"),
    "quoted_epochs": ("num_train_epochs: '3'\n", "3"),
    "warmup_ratio_form": ("warmup_steps: 0.1\n", 0.1),
    "warmup_exponent": ("warmup_steps: 1e2\n", 100.0),
    "steps_exponent": ("max_steps: 1e2\n", 100.0),
    "batch_exponent": ("per_device_train_batch_size: 1e1\n", 10.0),
    "cutoff_float": ("cutoff_len: 512.0\n", 512.0),
    "underscore_int": ("cutoff_len: 1_024\n", 1024),
}


@pytest.mark.parametrize("name", list(LF_TAKES))
def test_the_reader_takes_what_llamafactory_takes(tmp_path, name):
    text, value = LF_TAKES[name]
    y = read_yaml(write(tmp_path, "t.yaml", text))
    assert list(y.values()) == [value] and type(y[next(iter(y))]) is type(value)


@pytest.mark.slow
def test_llamafactory_get_train_args_takes_each_unchanged(tmp_path):
    """hparams/parser.py get_train_args on each (OmegaConf read, HfArgumentParser.parse_dict): it
    passes, and the argument holds the value as the reader read it (no conversion)."""
    from runconfig_oracle import ask

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "llama"}')
    base = ("model_name_or_path: model\nstage: sft\ndo_train: true\nfinetuning_type: lora\nlora_target: all\n"
            "dataset: tiny\ntemplate: qwen\noutput_dir: out\noverwrite_output_dir: true\nreport_to: none\nuse_cpu: true\n")
    cases = {}
    for name, (text, value) in LF_TAKES.items():
        (tmp_path / f"{name}.yaml").write_text(base + text)
        key = text.split(":")[0]
        cases[name] = {"mode": "args", "yaml": str(tmp_path / f"{name}.yaml"), "cwd": str(tmp_path), "show": key}
    got = ask(cases, tmp_path)
    assert {n: r for n, r in got.items() if not r["ok"]} == {}
    for name, (_, value) in LF_TAKES.items():
        assert got[name]["shown"] == repr(value), (name, got[name])
    # and what the reader takes, the rules judge: each quoted number or float count is MGD918
    from mgft_doctor.runconfig import codes, lf_rules

    for name in LF_TAKES:
        found = lf_rules.strings_for_numbers(lf_rules.LfRun(rc := load_run_config(str(tmp_path / f"{name}.yaml")),
                                                            lf_rules.llamafactory_args(rc)), lf_rules.Env())
        judged = name.startswith("quoted") or name in ("steps_exponent", "batch_exponent", "cutoff_float")
        assert [p.code for p in found] == ([codes.LF_STRING_NUMBER] if judged else []), (name, found)


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))


def test_billion_laughs_as_deepspeed_is_refused_at_once(tmp_path):
    yml = write(tmp_path, "train.yaml", BOMB + "deepspeed: *i\n")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
            "from mgft_doctor.runconfig import load_run_config\n"
            "try:\n    load_run_config(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__, e)")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, yml], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 30
    assert out.stdout.startswith("InputError ") and "more than 10,000 values" in out.stdout, out.stdout + out.stderr


def test_inline_deepspeed_mapping_is_the_config(tmp_path):
    yml = write(tmp_path, "t.yaml", "deepspeed:\n  zero_optimization:\n    stage: 3\n")
    rc = load_run_config(yml)
    assert rc.ds_inline and rc.zero_stage == 3 and rc.ds_error is None
    bad = write(tmp_path, "b.yaml", "deepspeed:\n  zero_optimization: [3]\n")
    rc = load_run_config(bad)
    assert rc.ds is None and rc.ds_error == f"{bad}: deepspeed.zero_optimization: expected a mapping, got a list"


def test_named_json_with_a_bad_shape_is_a_finding_not_a_crash(tmp_path):
    ds = write(tmp_path, "ds.json", {"zero_optimization": [1]})
    rc = load_run_config(write(tmp_path, "t.yaml", f"deepspeed: {ds}\n"))
    assert rc.ds is None and rc.ds_error == f"{ds}: zero_optimization: expected a mapping, got a list"


@pytest.mark.parametrize("ref, words", [("y" * 300 + ".json", "cannot be opened (file name too long)"),
                                        ("nowhere/ds.json", "was not found")])
def test_deepspeed_path_that_cannot_be_a_file(tmp_path, ref, words):
    yml = write(tmp_path, "t.yaml", f"deepspeed: {ref}\n")
    rc = load_run_config(yml)
    assert rc.ds is None and rc.ds_error.endswith(words) and len(rc.ds_error) < 300


def test_special_files_are_refused_without_reading_them(tmp_path):
    zero = tmp_path / "ds.json"
    zero.symlink_to("/dev/zero")
    assert "not a regular file" in error_of(read_ds_json, str(zero))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    assert "not a regular file" in error_of(read_ds_json, str(fifo))
    assert time.monotonic() - t0 < 5
    assert "is a directory" in error_of(read_yaml, str(tmp_path))


def test_size_cap_and_binary(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)
    assert "too large" in error_of(read_ds_json, str(big))
    (tmp_path / "bin.yaml").write_bytes(b"a: 1\x00\x01")
    assert "binary" in error_of(read_yaml, str(tmp_path / "bin.yaml"))


def test_a_config_path_too_long_or_with_nul(tmp_path):
    assert "file name too long" in error_of(read_yaml, str(tmp_path / ("z" * 5000)))
    assert "NUL" in error_of(read_yaml, "a\x00b.yaml")


def test_model_config_readers_never_crash(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").symlink_to("/dev/zero")
    cfg, why = load_model_config(str(tmp_path / "m"))
    assert cfg is None and "not a regular file" in why
    (tmp_path / "n").mkdir()
    (tmp_path / "n" / "config.json").write_text('{"hidden_size": 1e300, "num_hidden_layers": 2}')
    cfg, why = load_model_config(str(tmp_path / "n"))
    assert cfg is None and "hidden_size: 1e+300 is out of range" in why
    (tmp_path / "n" / "config.json").write_text('{"text_config": [1]}')
    assert "text_config: expected a mapping" in load_model_config(str(tmp_path / "n"))[1]
    assert load_model_config("q" * 5000)[0] is None
    assert load_model_config("bad\x00path")[0] is None


def test_missing_model_tells_a_path_from_a_hub_id(tmp_path):
    assert missing_model(str(tmp_path)) is None
    assert missing_model("Qwen/Qwen3-4B-Instruct-2507") is None
    for path in ("./no-such-model", str(tmp_path / "nope"), "../x/y", "a/b/c", "~/models/none"):
        assert missing_model(path).startswith(f"--model {path}: no such model folder"), path


def test_reading_stays_small(tmp_path):
    """A JSON of 2,000,000 numbers is refused within a few tens of MB (the walk stops at its bound)."""
    path = write(tmp_path, "ds.json", '{"x": [' + ",".join(["1"] * 2_000_000) + "]}")
    code = ("import sys\nfrom mgft_doctor.runconfig import read_ds_json\n"
            "try:\n    read_ds_json(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60)
    # VmHWM (KiB): the peak of this process's own memory; ru_maxrss would carry the forking parent's
    assert "more than 100,000 values" in out.stdout and int(out.stdout.split()[-1]) < 300_000, out.stdout + out.stderr


@pytest.mark.parametrize("field, value", [("num_experts", 2 ** 31), ("num_hidden_layers", "9" * 30),
                                          ("vocab_size", -1), ("hidden_size", 1e300)])
def test_a_model_size_the_arithmetic_cannot_hold_is_a_reason(tmp_path, field, value):
    """memory.py builds a list per expert and per layer: a size from a hostile config.json must not
    take the host's memory (it did: 18 GB for num_experts 2**31)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, field: value}))
    cfg, why = load_model_config(str(tmp_path))
    assert cfg is None and f"{field}: " in why and "out of range for a model size" in why and len(why) < 400


def test_check_cli_bad_shapes_are_exit_2_or_a_finding(tmp_path, run_doctor):
    """A JSON given to check: its bad shape is one line and exit 2 before any probe; the same JSON
    named by a YAML is config.deepspeed's finding with the key path (exit 1), never exit 3."""
    ds = write(tmp_path, "ds.json", {"zero_optimization": [1, 2]})
    code, out, err = run_doctor("check", ds, "--only", "config")
    assert code == 2 and err.strip() == f"mgft-doctor: {ds}: zero_optimization: expected a mapping, got a list"
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    code, out, err = run_doctor("check", str(zero), "--only", "config")
    assert code == 2 and "not a regular file" in err and len(err.strip().splitlines()) == 1
    yml = write(tmp_path, "t.yaml", f"deepspeed: {ds}\n")
    code, out, err = run_doctor("check", yml, "--only", "config.deepspeed", "--json", input="")
    found = json.loads(out)["probes"][0]["findings"]
    assert code == 1 and found[0]["message"] == f"{ds}: zero_optimization: expected a mapping, got a list"
