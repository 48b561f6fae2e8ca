"""Property-based tests (hypothesis) over what reads and repairs the user's run: the YAML/JSON
readers, the run-config probes (config.deepspeed, config.memory, config.zero3_guards, in process
on generated configs through the runner) and `fix` (plan, re-check, write). Thousands of inputs,
shaped like real configs and not; the properties: a reader returns a mapping or raises one line
of InputError; a probe never crashes (no `error` row, so check never exits 3); fix ends 0, 1 or
with a one-line error of exit 2, its repairs re-read cleanly and are not needed twice.
The counts of generated inputs are printed at the end of the module (-s shows them)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgft_doctor.check.context import Context, Facts, Options
from mgft_doctor.check.probe import Status
from mgft_doctor.check.runner import run_probe
from mgft_doctor.cli import build_parser
from mgft_doctor.cli.fix import run_fix
from mgft_doctor.errors import EXIT_USAGE, DoctorError, InputError
from mgft_doctor.probes import config_deepspeed, config_memory, config_zero3_guards
from mgft_doctor.runconfig import RunConfig, check_ds, ds_rules, read_ds_json, read_yaml
from mgft_doctor.runconfig.reading import parse_json

SETTINGS = settings(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
COUNTS: Counter = Counter()
FACTS = [{"device_count": 0},
         {"torch": "2.14.1", "device_count": 2, "nccl_available": True,
          "devices": [{"index": i, "name": "H200", "bf16": True, "total_memory": 140 << 30} for i in range(2)]},
         {"torch": "2.14.1", "device_count": 1, "nccl_available": True,
          "devices": [{"index": 0, "name": "V100", "bf16": False, "total_memory": 16 << 30}]}]

# ---- what configs are made of ------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 9), st.sampled_from([0, 1, 2, 3, 4, 8, 16, 64, 2 ** 31, 2 ** 63, 2 ** 70]),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1.0, 1e-5, 5e8, 1e300]),
    st.sampled_from(["auto", "Auto", "true", "false", "4", "1e-4", "cpu", "nvme", "none", "bnb", "hqq", "lora", "full",
                     "ratio", "sft", "", "x" * 300, "a\x00b", "examples/deepspeed/ds_z3_config.json"]),
    st.text(max_size=12))
DS_KEYS = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
           "fp16", "bf16", "zero_optimization", "optimizer", "scheduler", "zero_force_ds_cpu_optimizer",
           "tensor_parallel", "steps_per_print"]
SECTION_KEYS = {
    "fp16": ["enabled", "loss_scale"], "bf16": ["enabled"],
    "zero_optimization": ["stage", "offload_optimizer", "offload_param", "stage3_gather_16bit_weights_on_model_save",
                          "reduce_bucket_size", "stage3_prefetch_bucket_size", "overlap_comm", "sub_group_size"],
    "optimizer": ["type", "params"], "scheduler": ["type", "params"],
    "offload_optimizer": ["device", "nvme_path", "pin_memory"], "offload_param": ["device", "nvme_path"],
    "params": ["lr", "betas", "eps", "weight_decay", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
               "total_num_steps", "torch_adam"],
}
YAML_KEYS = ["model_name_or_path", "stage", "do_train", "finetuning_type", "per_device_train_batch_size",
             "gradient_accumulation_steps", "cutoff_len", "lora_rank", "ddp_timeout", "bf16", "fp16", "pure_bf16",
             "quantization_bit", "quantization_method", "flash_attn", "disable_gradient_checkpointing",
             "predict_with_generate", "pissa_init", "use_galore", "galore_layerwise", "use_badam", "badam_mode",
             "use_unsloth", "learning_rate", "max_grad_norm", "max_steps", "warmup_steps", "warmup_ratio",
             "num_train_epochs", "adam_beta2", "weight_decay", "dataset", "template", "val_size", "streaming"]
ARCH_KEYS = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "vocab_size", "head_dim", "tie_word_embeddings", "num_experts",
             "moe_intermediate_size", "text_config", "quantization_config"]


def anything(depth: int = 2):
    """Any JSON-able value, nested a little."""
    if depth == 0:
        return SCALARS
    inner = anything(depth - 1)
    return st.one_of(SCALARS, st.lists(inner, max_size=3),
                     st.dictionaries(st.sampled_from(["enabled", "stage", "device", "lr", "x", "params"]), inner, max_size=3))


def section(name: str, depth: int = 0):
    keys = SECTION_KEYS.get(name)
    if keys is None or depth > 2:
        return anything(1)
    plausible = st.dictionaries(st.sampled_from(keys), st.deferred(lambda: st.one_of(
        SCALARS, *(section(k, depth + 1) for k in keys if k in SECTION_KEYS))), max_size=len(keys))
    return st.one_of(plausible, plausible, anything(1))  # mostly the right shape


def _maybe(d: dict):
    """A mapping of some of these keys (each a strategy), the rest left out."""
    return st.fixed_dictionaries({}, optional=d)


PLAUSIBLE_DS = _maybe({
    "train_batch_size": st.sampled_from([1, 2, 8, 16, 32, 33, "auto"]),
    "train_micro_batch_size_per_gpu": st.sampled_from([1, 2, 4, 8, "auto"]),
    "gradient_accumulation_steps": st.sampled_from([1, 2, 4, 8, "auto"]),
    "gradient_clipping": st.sampled_from([0.5, 1.0, "auto"]),
    "fp16": _maybe({"enabled": st.sampled_from([True, False, "auto"]), "loss_scale": st.just(0)}),
    "bf16": _maybe({"enabled": st.sampled_from([True, False, "auto"])}),
    "zero_optimization": _maybe({
        "stage": st.sampled_from([0, 1, 2, 3, 3, 3, "3", 4, 2.0]),
        "offload_optimizer": _maybe({"device": st.sampled_from(["cpu", "nvme", "none"]),
                                     "nvme_path": st.just("/nvme"), "pin_memory": st.booleans()}),
        "offload_param": _maybe({"device": st.sampled_from(["cpu", "nvme", "none"]), "nvme_path": st.just("/nvme")}),
        "stage3_gather_16bit_weights_on_model_save": st.sampled_from([True, False]),
        "reduce_bucket_size": st.sampled_from([5e8, "auto"]), "stage3_prefetch_bucket_size": st.sampled_from([5e8, "auto"]),
        "stage3_param_persistence_threshold": st.just("auto"), "allgather_bucket_size": st.just(5e8)}),
    "optimizer": _maybe({"type": st.sampled_from(["AdamW", "Adam", "SGD"]), "params": _maybe({
        "lr": st.sampled_from(["auto", 1e-5, 3e-5]), "betas": st.sampled_from(["auto", [0.9, 0.999], [0.9, 0.95]]),
        "eps": st.sampled_from(["auto", 1e-8]), "weight_decay": st.sampled_from(["auto", 0.0, 0.1]),
        "torch_adam": st.booleans()})}),
    "scheduler": _maybe({"type": st.sampled_from(["WarmupLR", "WarmupDecayLR"]), "params": _maybe({
        "warmup_min_lr": st.sampled_from(["auto", 0]), "warmup_max_lr": st.sampled_from(["auto", 1e-5]),
        "warmup_num_steps": st.sampled_from(["auto", 0, 10]), "total_num_steps": st.sampled_from(["auto", 10, 1000])})}),
    "zero_force_ds_cpu_optimizer": st.booleans(),
})
PLAUSIBLE_YAML = _maybe({
    "stage": st.sampled_from(["sft", "pt", "dpo", "rm", "kto", "ppo"]), "do_train": st.booleans(),
    "finetuning_type": st.sampled_from(["lora", "full", "freeze"]),
    "per_device_train_batch_size": st.sampled_from([1, 2, 4, 8]), "gradient_accumulation_steps": st.sampled_from([1, 2, 8]),
    "cutoff_len": st.sampled_from([512, 2048, 8192]), "lora_rank": st.sampled_from([8, 64]),
    "ddp_timeout": st.sampled_from([1800, 180000000, 1.5e9]), "bf16": st.booleans(), "fp16": st.booleans(),
    "pure_bf16": st.booleans(), "quantization_bit": st.sampled_from([4, 8]),
    "quantization_method": st.sampled_from(["bnb", "hqq", "eetq", "gptq"]),
    "flash_attn": st.sampled_from(["auto", "fa2", "disabled"]), "disable_gradient_checkpointing": st.booleans(),
    "predict_with_generate": st.booleans(), "use_badam": st.booleans(), "badam_mode": st.sampled_from(["layer", "ratio"]),
    "learning_rate": st.sampled_from([1e-4, 1e-5, 3e-5, "1e-4"]), "max_grad_norm": st.sampled_from([0.5, 1.0]),
    "max_steps": st.sampled_from([-1, 10]), "warmup_steps": st.sampled_from([0, 2]), "warmup_ratio": st.sampled_from([0.0, 0.1]),
    "num_train_epochs": st.sampled_from([1.0, 3.0]), "dataset": st.just("identity"), "template": st.just("qwen"),
})
PLAUSIBLE_MODEL = st.fixed_dictionaries(
    {"model_type": st.sampled_from(["llama", "qwen2", "qwen3_moe", "mixtral"]),
     "hidden_size": st.sampled_from([64, 4096]), "num_hidden_layers": st.sampled_from([2, 32]),
     "num_attention_heads": st.sampled_from([4, 32]), "vocab_size": st.sampled_from([1000, 151936])},
    optional={"num_key_value_heads": st.sampled_from([1, 4, 8]), "intermediate_size": st.sampled_from([128, 11008]),
              "num_experts": st.sampled_from([0, 8, 64]), "moe_intermediate_size": st.sampled_from([64, 1408]),
              "tie_word_embeddings": st.booleans(),
              "quantization_config": _maybe({"quant_method": st.sampled_from(["bitsandbytes", "gptq", "fp8"]),
                                             "load_in_4bit": st.booleans(), "bits": st.sampled_from([4, 8])})})


def ds_config():
    """Mostly shaped like DeepSpeed configs, sometimes with any value anywhere."""
    wild = st.dictionaries(st.sampled_from(DS_KEYS), st.deferred(lambda: st.one_of(
        SCALARS, *(section(k) for k in ("fp16", "bf16", "zero_optimization", "optimizer", "scheduler")))), max_size=8)
    spoiled = st.tuples(PLAUSIBLE_DS, wild).map(lambda t: {**t[0], **t[1]})
    return st.one_of(PLAUSIBLE_DS, PLAUSIBLE_DS, PLAUSIBLE_DS, spoiled, wild)


def yaml_config():
    wild = st.dictionaries(st.sampled_from(YAML_KEYS), st.one_of(SCALARS, SCALARS, anything(1)), max_size=10)
    spoiled = st.tuples(PLAUSIBLE_YAML, wild).map(lambda t: {**t[0], **t[1]})
    return st.one_of(PLAUSIBLE_YAML, PLAUSIBLE_YAML, PLAUSIBLE_YAML, spoiled, wild)


def model_config():
    sizes = st.one_of(st.sampled_from([1, 2, 4, 8, 64, 128, 1000, 4096]), SCALARS)
    wild = st.dictionaries(st.sampled_from(ARCH_KEYS), st.one_of(sizes, st.dictionaries(
        st.sampled_from(ARCH_KEYS), sizes, max_size=5)), max_size=10)
    spoiled = st.tuples(PLAUSIBLE_MODEL, wild).map(lambda t: {**t[0], **t[1]})
    return st.one_of(PLAUSIBLE_MODEL, PLAUSIBLE_MODEL, spoiled, wild)


def run_configs():
    """(YAML dict, DeepSpeed dict, model config dict, how the YAML names the JSON)."""
    return st.tuples(yaml_config(), ds_config(), model_config(),
                     st.sampled_from(["file", "file", "file", "inline", "missing", "junk", "none"]))


def as_yaml(data) -> str:
    try:
        return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), allow_unicode=True)
    except yaml.YAMLError:
        return "x: 1\n"


def materialize(folder: Path, y: dict, ds: dict, model: dict, how: str) -> tuple[str, str]:
    """The files of a run: (train.yaml, ds.json) in folder."""
    (folder / "ds.json").write_text(json.dumps(ds, indent=2))
    (folder / "model").mkdir(exist_ok=True)
    (folder / "model" / "config.json").write_text(json.dumps(model))
    y = dict(y)
    if isinstance(y.get("model_name_or_path"), str) or "model_name_or_path" not in y:
        y["model_name_or_path"] = str(folder / "model")
    y["deepspeed"] = {"file": str(folder / "ds.json"), "inline": ds, "missing": str(folder / "nope.json"),
                      "junk": y.get("deepspeed"), "none": None}[how]
    (folder / "train.yaml").write_text(as_yaml(y))
    return str(folder / "train.yaml"), str(folder / "ds.json")


# ---- the readers --------------------------------------------------------------------------------

def one_line_input_error(fn, *args):
    try:
        out = fn(*args)
    except InputError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 1000, str(exc)
        return None
    assert isinstance(out, dict)
    return out


MUTATIONS = st.lists(st.tuples(st.integers(0, 400), st.sampled_from(
    ["&a ", "*a", "[", "]", "{", "}", ":", "\n  ", "- ", "!!python/object:os.system ", "!!set ", ".inf", "\t", "'", '"',
     "<<: *a\n", "? ", "---\n", "\x00", "1e400", "NaN", ",", "\\u0000"])), max_size=4)
MUTATIONS = st.one_of(st.just([]), MUTATIONS)  # half the texts as written, half damaged


def mutate(text: str, edits) -> str:
    for at, piece in edits:
        at = min(at, len(text))
        text = text[:at] + piece + text[at:]
    return text


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One folder for every example (a new folder per example costs more than the example), in
    memory where the machine has /dev/shm."""
    if os.access("/dev/shm", os.W_OK):
        with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="mgft-fuzz-") as d:
            yield Path(d)
    else:
        yield tmp_path_factory.mktemp("fuzz")


def fresh(folder: Path) -> Path:
    for p in folder.glob("*.bak"):
        p.unlink()
    return folder


@settings(SETTINGS, max_examples=700)
@given(y=yaml_config(), edits=MUTATIONS)
def test_yaml_reader_never_crashes(work, y, edits):
    path = os.path.join(work, "train.yaml")
    Path(path).write_text(mutate(as_yaml(y), edits), encoding="utf-8", errors="surrogatepass")
    data = one_line_input_error(read_yaml, path)
    COUNTS["yaml texts: " + ("read" if data is not None else "refused in one line")] += 1
    if data is not None:  # what is read is plain: the rules may walk it freely
        json.dumps(data, allow_nan=False)


@settings(SETTINGS, max_examples=700)
@given(ds=ds_config(), edits=MUTATIONS)
def test_json_reader_never_crashes(work, ds, edits):
    path = os.path.join(work, "ds.json")
    Path(path).write_text(mutate(json.dumps(ds, indent=2), edits), encoding="utf-8", errors="surrogatepass")
    data = one_line_input_error(read_ds_json, path)
    COUNTS["json texts: " + ("read" if data is not None else "refused in one line")] += 1
    if data is not None:
        json.dumps(data, allow_nan=False)


# ---- the probes -----------------------------------------------------------------------------------

def probes_on(config: str, facts: dict) -> list:
    """The config probes as `check --only config` runs them, in process (the runner, no subprocess)."""
    ctx = Context(Options(config=config))
    ctx.__dict__["facts"] = Facts(facts)
    try:
        ctx.run_config
    except InputError as exc:
        assert "\n" not in str(exc)
        COUNTS["run configs: refused in one line (exit 2)"] += 1
        return []
    results = [run_probe(p.PROBE, ctx) for p in (config_deepspeed, config_memory, config_zero3_guards)]
    for r in results:
        COUNTS[f"run configs: {r.id} {r.status.value}"] += 1
    return results


@settings(SETTINGS, max_examples=400)
@given(run=run_configs(), facts=st.sampled_from(FACTS))
def test_config_probes_never_crash(work, run, facts):
    yml, ds = materialize(fresh(work), *run)
    for config in (yml, ds):
        COUNTS["run configs"] += 1
        for res in probes_on(config, facts):
            assert res.status is not Status.ERROR, (res.id, res.summary, res.details[-3:])


# ---- fix --------------------------------------------------------------------------------------------

def fix_in_process(*argv) -> tuple[int, str]:
    args = build_parser().parse_args(["fix", *argv])
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            return run_fix(args), out.getvalue()
    except DoctorError as exc:
        assert exc.exit_code == EXIT_USAGE and "\n" not in str(exc), str(exc)  # never the doctor's own bug
        return exc.exit_code, str(exc)


@pytest.fixture(autouse=True)
def no_gpu_facts(monkeypatch):
    monkeypatch.setattr("mgft_doctor.check.context.read_facts", lambda *a, **k: Facts({"device_count": 0}))


@settings(SETTINGS, max_examples=300)
@given(run=run_configs(), flags=st.sampled_from([[], ["--unsafe"], ["--no-trainer"], ["--no-trainer", "--unsafe"]]),
       world=st.sampled_from(["1", "2", "8"]))
def test_fix_never_crashes_and_needs_no_second_pass(work, run, flags, world):
    yml, ds = materialize(fresh(work), *run)
    for config in (ds, yml):
        argv = [config, "--world-size", world, *flags]
        code, _ = fix_in_process(*argv)
        COUNTS[f"fix: exit {code}"] += 1
        assert code in (0, 1, 2)
        if code != 1:
            continue
        code, out = fix_in_process(*argv, "--write")
        COUNTS[f"fix --write: exit {code}"] += 1
        assert code in (0, 1, 2)  # 1: only unsafe repairs, held back
        if code == 0 and "wrote" in out:
            again, out = fix_in_process(*argv)
            assert again == 0 or "unsafe, not applied" in out, out
            for written in (ds, yml):
                one_line_input_error(read_ds_json if written.endswith(".json") else read_yaml, written)
        fresh(work)


@settings(SETTINGS, max_examples=500)
@given(ds=ds_config(), world=st.sampled_from([1, 2, 8]), bf16=st.sampled_from([None, True, False]),
       for_initialize=st.booleans())
def test_repairs_never_add_a_failure(ds, world, bf16, for_initialize):
    """The rules' own promise, without the CLI: a repaired JSON (alone) meets no failure it did
    not have, and its repairs are done in one pass."""
    COUNTS["rule repairs planned"] += 1
    try:
        ds = parse_json(json.dumps(ds), "ds.json")
        rc = RunConfig(ds_path="ds.json", ds=check_ds(ds, "ds.json"), for_initialize=for_initialize)
    except (InputError, ValueError):
        return
    before = {(p.code, p.message) for p in ds_rules.check(rc, world, bf16) if p.severity == "fail"}
    plan = ds_rules.plan_repairs(rc, world, bf16, unsafe=True)
    fixed = RunConfig(ds_path="ds.json", ds=plan.deepspeed, for_initialize=for_initialize)
    after = [p for p in ds_rules.check(fixed, world, bf16) if p.severity == "fail" and (p.code, p.message) not in before]
    assert after == [] and ds_rules.plan_repairs(fixed, world, bf16, unsafe=True).applied == []
    if for_initialize:  # precision is never switched off: what was (or could be) mixed stays mixed
        was = any(_enabled(ds, k) in (True, "auto") for k in ("bf16", "fp16"))
        now = any(_enabled(plan.deepspeed, k) in (True, "auto") for k in ("bf16", "fp16"))
        assert now or not was


def _enabled(ds: dict, section: str):
    sec = ds.get(section)
    return sec.get("enabled") if isinstance(sec, dict) else None


def test_zz_counts():
    """The fuzzing counts (run with -s to see them): generated inputs, crashes 0 (the tests above)."""
    print("\nfuzz counts:")
    for key, n in sorted(COUNTS.items()):
        print(f"  {key}: {n}")
