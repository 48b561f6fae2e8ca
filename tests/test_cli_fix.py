"""`mgft-doctor fix`: it repairs what check reports as repairable (safe by default, unsafe with
--unsafe), keeps "auto" where the HF Trainer fills it, never switches precision off, shares
check's world size, and writes like a careful editor (symlinks, a planted temp link, modes, a
full disk, a dangling .bak link, no final newline, the JSON LLaMA-Factory really opens)."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mgft_doctor.check.context import Context, Facts, Options
from mgft_doctor.cli import build_parser
from mgft_doctor.cli.fix import Machine, run_fix
from mgft_doctor.errors import DoctorError
from mgft_doctor.probes import config_deepspeed
from mgft_doctor.runconfig import codes, ds_rules, load_run_config

EXAMPLES = Path("/work/shared/llamafactory-examples")
Z3_NO_GATHER = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                "zero_optimization": {"stage": 3}}


@pytest.fixture(autouse=True)
def no_gpu_facts(monkeypatch):
    """torch's view of this machine as the facts worker reports it here (no GPU), without the
    seconds of the worker; fix asks it only when the GPUs decide a repair."""
    monkeypatch.setattr("mgft_doctor.check.context.read_facts", lambda *a, **k: Facts({"device_count": 0}))


def fix(*argv, cwd=None):
    """The fix command in this process: (exit code, stdout, the one-line error or '')."""
    args = build_parser().parse_args(["fix", *argv])
    out = io.StringIO()
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out):
            code = run_fix(args)
        return code, out.getvalue(), ""
    except DoctorError as exc:
        return exc.exit_code, out.getvalue(), str(exc)
    finally:
        os.chdir(old)


def write(path: Path, data) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n" if not isinstance(data, str) else data)
    return str(path)


# ---- what is repaired, and how it is labelled ---------------------------------------------------

@pytest.mark.parametrize("name", sorted(p.name for p in (EXAMPLES / "deepspeed").glob("*.json")))
def test_llamafactory_jsons_keep_their_auto_values(tmp_path, name):
    ds = tmp_path / name
    shutil.copy(EXAMPLES / "deepspeed" / name, ds)
    original = ds.read_bytes()
    for extra in ([], ["--unsafe"]):
        code, out, err = fix(str(ds), "--world-size", "2", "--write", *extra)
        assert code == 0 and err == "" and "nothing to repair" in out, out + err
        assert ds.read_bytes() == original and not (tmp_path / (name + ".bak")).exists()


def test_safe_repairs_by_default_unsafe_with_the_flag(tmp_path):
    ds = write(tmp_path / "ds.json", Z3_NO_GATHER)
    code, out, _ = fix(ds, "--world-size", "4")
    assert code == 1
    assert f"# safe: {codes.ZERO3_EMPTY_SAVE}" in out and f"# unsafe, not applied (pass --unsafe): {codes.DS_BATCH_ARITHMETIC}" in out
    assert f"+++ {ds} (repaired: 1 safe, 0 unsafe)" in out and '"train_batch_size": 16' not in out.split("+++")[1]
    code, out, _ = fix(ds, "--world-size", "4", "--unsafe", "--write")
    assert code == 0 and f"+++ {ds} (repaired: 1 safe, 1 unsafe)" in out
    fixed = json.loads(Path(ds).read_text())
    assert fixed["train_batch_size"] == 8 and fixed["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert Path(ds + ".bak").read_text() == json.dumps(Z3_NO_GATHER, indent=2) + "\n"
    os.unlink(ds + ".bak")
    assert fix(ds, "--world-size", "4", "--unsafe", "--write")[1].strip().endswith("nothing to repair")


def test_fix_repairs_exactly_what_check_reports_as_repairable(tmp_path):
    """check's fix text names the repair and its label; fix applies those and only those."""
    ds = write(tmp_path / "ds.json", dict(Z3_NO_GATHER, fp16={"enabled": True}, bf16={"enabled": True}))
    rc = load_run_config(ds)
    reported = ds_rules.check(rc, 4, True)
    repairable = {(p.code, p.label) for p in reported if p.repair is not None}
    assert all(f"[{p.label} repair: mgft-doctor fix" in p.fix for p in reported if p.repair is not None)
    plan = ds_rules.plan_repairs(rc, 4, True, unsafe=False)
    assert {(p.code, p.label) for p in plan.applied} == {x for x in repairable if x[1] == "safe"}
    assert {(p.code, p.label) for p in plan.held_back} == {x for x in repairable if x[1] == "unsafe"}
    assert {p.code for p in ds_rules.plan_repairs(rc, 4, True, unsafe=True).applied} == {c for c, _ in repairable}


def test_precision_is_never_switched_off(tmp_path):
    both = write(tmp_path / "both.json", {"fp16": {"enabled": True}, "bf16": {"enabled": True},
                                           "zero_optimization": {"stage": 2}})
    fix(both, "--world-size", "2", "--unsafe", "--write")
    fixed = json.loads(Path(both).read_text())
    assert fixed["bf16"]["enabled"] is True and fixed["fp16"]["enabled"] is False
    alone = tmp_path / "z3.json"
    shutil.copy(EXAMPLES / "deepspeed" / "ds_z3_config.json", alone)
    code, out, _ = fix(str(alone), "--world-size", "2", "--no-trainer", "--unsafe", "--write")
    fixed = json.loads(alone.read_text())
    assert code == 0 and fixed["bf16"]["enabled"] is True and fixed["fp16"]["enabled"] is False
    assert "train_batch_size" not in fixed and fixed["train_micro_batch_size_per_gpu"] == 1
    assert "reduce_bucket_size" not in fixed["zero_optimization"]  # DeepSpeed's default
    assert "sub_group_size\": 1e9" in alone.read_text()  # numbers as written


def test_no_trainer_labels_picked_numbers_unsafe(tmp_path):
    ds = write(tmp_path / "ds.json", {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto",
                                      "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                                      "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})
    code, out, _ = fix(ds, "--world-size", "2", "--no-trainer", "--write")
    fixed = json.loads(Path(ds).read_text())
    assert fixed["optimizer"]["params"]["lr"] == "auto" and "gradient_accumulation_steps" not in fixed
    assert "unsafe, not applied" in out and "optimizer.params.lr" in out
    assert fix(ds, "--world-size", "2", "--no-trainer")[0] == 1  # the learning rate is still to pick


def test_fix_yaml_repairs_what_check_yaml_warns_about(tmp_path):
    write(tmp_path / "ds.json", {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}})
    yml = write(tmp_path / "train.yaml", "### model\nmodel_name_or_path: m  # a comment\ndeepspeed: ds.json\n"
                                         "per_device_train_batch_size: 2\nddp_timeout: 180000000  # LLaMA-Factory's\n")
    rc = load_run_config(yml)
    assert {p.code for p in ds_rules.check(rc, 2, True)} >= {codes.DS_HF_MISMATCH, codes.NCCL_WATCHDOG_TIMEOUT}
    code, out, _ = fix(yml, "--world-size", "2", "--write", cwd=tmp_path)
    assert code == 0 and json.loads((tmp_path / "ds.json").read_text())["train_micro_batch_size_per_gpu"] == "auto"
    assert "ddp_timeout: 180000000" in Path(yml).read_text()  # the unsafe one waits for --unsafe
    os.unlink(tmp_path / "ds.json.bak")
    code, out, _ = fix(yml, "--world-size", "2", "--unsafe", "--write", cwd=tmp_path)
    text = Path(yml).read_text()
    assert code == 0 and "ddp_timeout: 7200  # LLaMA-Factory's\n" in text and "model_name_or_path: m  # a comment" in text
    assert ds_rules.plan_repairs(load_run_config(yml), 2, True, unsafe=True).applied == []


def test_inline_deepspeed_is_not_claimed_repairable(tmp_path):
    yml = write(tmp_path / "t.yaml", "deepspeed:\n  zero_optimization:\n    stage: 3\n")
    probs = ds_rules.check(load_run_config(yml), 2, True)
    assert [p.label for p in probs if p.code == codes.ZERO3_EMPTY_SAVE] == ["no automatic repair"]
    code, out, _ = fix(yml, "--world-size", "2")
    assert code == 0 and "no automatic repair" in out and "nothing to repair" in out


# ---- the world size --------------------------------------------------------------------------

@pytest.mark.parametrize("argv, env, words", [
    (["--world-size", "-4"], {}, "--world-size must be a number of GPUs"),
    (["--world-size", "0"], {}, "--world-size must be a number of GPUs"),
    ([], {"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a number of GPUs"),
    ([], {"WORLD_SIZE": "0"}, "WORLD_SIZE=0 is not a number of GPUs"),
    ([], {"WORLD_SIZE": "-4"}, "WORLD_SIZE='-4' is not a number of GPUs"),
])
def test_bad_world_sizes_are_one_line(tmp_path, monkeypatch, argv, env, words):
    ds = write(tmp_path / "ds.json", Z3_NO_GATHER)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, out, err = fix(ds, *argv)
    assert code == 2 and words in err and "\n" not in err


@pytest.mark.parametrize("facts, expected", [({"device_count": 0}, 2), ({"device_count": 4, "nccl_available": True}, 4)])
def test_the_default_world_size_is_checks(monkeypatch, facts, expected):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = Context(Options())
    ctx.__dict__["facts"] = Facts(facts)
    machine = Machine(None)
    machine.__dict__["ctx"] = ctx
    assert machine.world == config_deepspeed.world_size(ctx) == expected


# ---- writing ---------------------------------------------------------------------------------

def test_a_symlinked_config_is_fixed_behind_the_link(tmp_path):
    real = Path(write(tmp_path / "real" / "ds.json", Z3_NO_GATHER))
    link = tmp_path / "ds.json"
    link.symlink_to(real)
    assert fix(str(link), "--world-size", "8", "--write")[0] == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text())["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert (tmp_path / "real" / "ds.json.bak").is_file()


def test_a_link_planted_at_the_temporary_path_is_not_followed(tmp_path, monkeypatch):
    ds = write(tmp_path / "ds.json", Z3_NO_GATHER)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "ds.json.mgft-doctor.tmp").symlink_to(victim)  # the old fixed name
    planted = tmp_path / ".ds.json.planted.mgft-doctor.tmp"
    planted.symlink_to(victim)
    names = iter(["planted", "free0001"])
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)
    assert fix(ds, "--world-size", "8", "--write")[0] == 0
    assert victim.read_text() == "keep me" and planted.is_symlink()
    assert json.loads(Path(ds).read_text())["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert not list(tmp_path.glob(".ds.json.free0001*"))


def test_permissions_are_kept(tmp_path):
    ds = write(tmp_path / "ds.json", Z3_NO_GATHER)
    os.chmod(ds, 0o600)
    assert fix(ds, "--world-size", "8", "--write")[0] == 0
    assert os.stat(ds).st_mode & 0o777 == 0o600 and os.stat(ds + ".bak").st_mode & 0o777 == 0o600


def test_a_dangling_backup_link_is_refused(tmp_path):
    ds = write(tmp_path / "ds.json", Z3_NO_GATHER)
    (tmp_path / "ds.json.bak").symlink_to(tmp_path / "elsewhere" / "x")
    code, _, err = fix(ds, "--world-size", "8", "--write")
    assert code == 2 and "is a symbolic link" in err and "\n" not in err
    assert not (tmp_path / "elsewhere").exists() and json.loads(Path(ds).read_text()) == Z3_NO_GATHER


FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
from mgft_doctor.cli import main
sys.exit(main(["fix", sys.argv[2], "--world-size", "8", "--write"]))
"""


@pytest.mark.parametrize("room", ["none", "backup only"])
def test_a_full_disk_leaves_the_original_and_no_backup(tmp_path, room):
    """RLIMIT_FSIZE (SIGXFSZ ignored) makes writes past the limit fail with EFBIG, as ENOSPC would:
    either the backup or the new file cannot be written."""
    ds = write(tmp_path / "ds.json", Z3_NO_GATHER)
    original = Path(ds).read_bytes()
    limit = 10 if room == "none" else len(original) + 1
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(limit), ds], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "WORLD_SIZE"})
    assert proc.returncode == 2 and "nothing" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert Path(ds).read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json"]  # no .bak, no temporary file
    assert fix(ds, "--world-size", "8", "--write")[0] == 0  # nothing blocks the next --write


def test_the_diff_is_right_without_a_final_newline(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(Z3_NO_GATHER, indent=2))  # no final newline
    before = ds.read_text()
    code, out, _ = fix(str(ds), "--world-size", "8")
    assert "\\ No newline at end of file" in out
    diff = out[out.index("--- "):out.index("\n(not written")]
    if shutil.which("patch"):
        subprocess.run(["patch", "-s", str(ds)], input=diff, text=True, check=True)
        assert json.loads(ds.read_text())["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
        assert ds.read_text().endswith("}\n") and before != ds.read_text()


def test_the_json_llamafactory_opens_never_a_namesake(tmp_path):
    """`deepspeed:` is a plain path opened relative to where llamafactory-cli starts: a same-named
    file two folders up is not it; a checkout-relative path is written only from the checkout."""
    write(tmp_path / "ds.json", Z3_NO_GATHER)  # the namesake
    yml = write(tmp_path / "a" / "b" / "train.yaml", "deepspeed: ds.json\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, _, err = fix(yml, "--world-size", "8", "--write", cwd=elsewhere)
    assert code == 2 and err.endswith(f"'ds.json' named in {yml} was not found")
    assert json.loads((tmp_path / "ds.json").read_text()) == Z3_NO_GATHER
    root = tmp_path / "LLaMA-Factory"
    write(root / "examples" / "deepspeed" / "z3.json", Z3_NO_GATHER)
    yml = write(root / "examples" / "train_lora" / "sft.yaml", "deepspeed: examples/deepspeed/z3.json\n")
    code, _, err = fix(yml, "--world-size", "8", "--write", cwd=elsewhere)
    assert code == 2 and f"from {root}, where the run starts" in err
    assert fix(yml, "--world-size", "8", "--write", cwd=root)[0] == 0
    assert json.loads((root / "examples/deepspeed/z3.json").read_text())["zero_optimization"][
        "stage3_gather_16bit_weights_on_model_save"] is True


@pytest.mark.parametrize("content,words", [("{not json", "not valid JSON"), ('{"a": 1, "a": 2}', "duplicate key")])
def test_fix_bad_json_is_one_line(tmp_path, run_doctor, content, words):
    p = tmp_path / "ds.json"
    p.write_text(content)
    code, out, err = run_doctor("fix", str(p))
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_the_cli_end_to_end(tmp_path, run_doctor):
    ds = write(tmp_path / "ds.json", Z3_NO_GATHER)
    code, out, err = run_doctor("fix", ds, "--world-size", "-4")
    assert code == 2 and err.strip() == "mgft-doctor: --world-size must be a number of GPUs, 1 to 1048576, not -4"
    code, out, err = run_doctor("fix", ds, "--world-size", "8", "--write")
    assert code == 0 and "wrote" in out


# ---- the round trip over LLaMA-Factory's own configs ---------------------------------------------

SHIPPED = sorted(p.name for p in (EXAMPLES / "deepspeed").glob("*.json"))
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


def example_yaml_for(name: str) -> str:
    """An example YAML that uses the JSON (LLaMA-Factory's own where one names it, else its LoRA
    SFT example with the deepspeed: line added), the model swapped for a local config."""
    users = [p for p in sorted(EXAMPLES.glob("train_*/*.yaml"))
             if f"deepspeed: examples/deepspeed/{name}" in p.read_text() and "vl" not in p.name]
    text = (users[0] if users else EXAMPLES / "train_lora" / "qwen3_lora_sft.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith(("model_name_or_path:", "deepspeed:"))]
    return "\n".join(["model_name_or_path: model", f"deepspeed: examples/deepspeed/{name}", *lines]) + "\n"


def round_trip_case(root: Path, name: str) -> Path:
    """A folder laid out as a LLaMA-Factory checkout (llamafactory-cli starts there): the JSON, the
    YAML, a tiny model's config.json and the two datasets the examples name."""
    case = root / name.removesuffix(".json")
    (case / "examples" / "deepspeed").mkdir(parents=True)
    shutil.copy(EXAMPLES / "deepspeed" / name, case / "examples" / "deepspeed" / name)
    write(case / "model" / "config.json", TINY)
    rows = [{"instruction": "hi", "input": "", "output": "hello"}] * 4
    write(case / "data" / "identity.json", rows)
    write(case / "data" / "alpaca_en_demo.json", rows)
    write(case / "data" / "dataset_info.json", {"identity": {"file_name": "identity.json"},
                                                "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"}})
    write(case / "train.yaml", example_yaml_for(name))
    return case


def fix_both(case: Path, name: str, unsafe: bool) -> None:
    flags = ["--unsafe"] if unsafe else []
    for target in (f"examples/deepspeed/{name}", "train.yaml"):
        code, out, err = fix(target, "--world-size", "1", "--write", *flags, cwd=case)
        assert code in (0, 1) and err == "", (target, code, out, err)  # 1: unsafe repairs held back


def check_in_process(case: Path) -> list:
    old = os.getcwd()
    os.chdir(case)
    try:
        from mgft_doctor.check.runner import run_probe
        from mgft_doctor.probes import config_memory, config_zero3_guards

        ctx = Context(Options(config="train.yaml", nproc=1))
        ctx.__dict__["facts"] = Facts({"device_count": 0})
        return [run_probe(p.PROBE, ctx) for p in (config_deepspeed, config_zero3_guards, config_memory)]
    finally:
        os.chdir(old)


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
@pytest.mark.parametrize("name", SHIPPED)
def test_round_trip_fix_then_check(tmp_path, name, unsafe):
    case = round_trip_case(tmp_path, name)
    fix_both(case, name, unsafe)
    shipped = json.loads((EXAMPLES / "deepspeed" / name).read_text())
    assert json.loads((case / "examples" / "deepspeed" / name).read_text()) == shipped  # "auto" kept
    results = check_in_process(case)
    assert [(r.id, r.status.value) for r in results if r.status.value in ("fail", "error")] == [], \
        [(r.id, r.summary, [f.message for f in r.findings]) for r in results]
    if unsafe:
        assert "ddp_timeout: 7200" in (case / "train.yaml").read_text()


PLANTED = {"gradient_accumulation_steps": 4, "train_micro_batch_size_per_gpu": 3, "train_batch_size": 99,
           "fp16": {"enabled": True}, "bf16": {"enabled": True}}


def planted_case(root: Path) -> Path:
    """LLaMA-Factory's ZeRO-3 JSON broken the ways users break it (numbers that disagree with the
    YAML, both precisions on, no 16-bit gather on save): what check fails and fix repairs, safely."""
    case = round_trip_case(root, "ds_z3_config.json")
    path = case / "examples" / "deepspeed" / "ds_z3_config.json"
    ds = json.loads(path.read_text())
    ds.update(PLANTED)
    ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    write(path, ds)
    return case


def test_planted_problems_are_repaired_so_that_check_passes(tmp_path):
    case = planted_case(tmp_path)
    assert {r.id for r in check_in_process(case) if r.status.value == "fail"} == {"config.deepspeed"}
    code, out, err = fix("train.yaml", "--world-size", "1", "--write", cwd=case)
    assert code == 0 and "# safe:" in out, out + err
    ds = json.loads((case / "examples" / "deepspeed" / "ds_z3_config.json").read_text())
    assert {k: ds[k] for k in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu", "train_batch_size")} == \
        dict.fromkeys(("gradient_accumulation_steps", "train_micro_batch_size_per_gpu", "train_batch_size"), "auto")
    assert ds["fp16"]["enabled"] == ds["bf16"]["enabled"] == "auto"  # the YAML's bf16: true decides, as before
    assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert [r.id for r in check_in_process(case) if r.status.value in ("fail", "error")] == []


@pytest.mark.slow
def test_round_trip_through_check_and_the_trainer(tmp_path, run_doctor):
    """Every shipped JSON, fixed (safe, then --unsafe), with an example YAML that uses it: the real
    `check --only config` and transformers' HfTrainerDeepSpeedConfig process + finalize on
    TrainingArguments built by LLaMA-Factory from the YAML (tests/runconfig_oracle.py): no failure."""
    from runconfig_oracle import ask

    cases, seen = {}, {}
    for name in SHIPPED:
        for unsafe in (False, True):
            case = round_trip_case(tmp_path / ("unsafe" if unsafe else "safe"), name)
            fix_both(case, name, unsafe)
            cases[f"{name}:{'unsafe' if unsafe else 'safe'}"] = {
                "mode": "pair", "yaml": str(case / "train.yaml"), "ds": str(case / "examples" / "deepspeed" / name),
                "cwd": str(case)}
            if unsafe:
                old = os.getcwd()
                os.chdir(case)
                try:
                    seen[name] = run_doctor("check", "train.yaml", "--only", "config", "--nproc", "1", "--json", input="")
                finally:
                    os.chdir(old)
    planted = planted_case(tmp_path / "planted")
    broken = {"mode": "pair", "yaml": str(planted / "train.yaml"), "cwd": str(planted),
              "ds": str(planted / "examples" / "deepspeed" / "ds_z3_config.json")}
    assert not ask({"before": broken}, tmp_path / "planted")["before"]["ok"]  # the Trainer refuses it as planted
    assert fix("train.yaml", "--world-size", "1", "--write", cwd=planted)[0] == 0
    cases["planted ds_z3_config.json, fixed"] = broken
    for name, (code, out, err) in seen.items():
        probes = json.loads(out)["probes"]
        bad = [(p["id"], p["summary"], p["findings"]) for p in probes if p["status"] in ("fail", "error")]
        assert code == 0 and bad == [], (name, code, bad, err[-2000:])
    got = ask(cases, tmp_path)
    assert {k: v for k, v in got.items() if not v["ok"]} == {}
