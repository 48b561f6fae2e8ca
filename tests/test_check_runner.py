"""The runner's side of the probe contract: applies() is asked before run() (a reason skips the
probe, a crash in it is an `error` row, bad input still stops the command), the probes' own
guards keep their texts, and `--list` says why a probe would skip. No processes: torch's facts
are given to the context as the facts worker would report them."""

import json

import pytest

from mgft_doctor.check.context import Context, Facts, Options
from mgft_doctor.check.probe import Finding, Probe, ProbeResult, Status, result, skip, verdict
from mgft_doctor.check.runner import run_probe, would_skip
from mgft_doctor.cli.check import list_probes
from mgft_doctor.errors import DoctorError
from mgft_doctor.probes import (config_deepspeed, config_memory, config_zero3_guards, deepspeed_ops, nccl_p2p,
                                zero3_model)

NO_TORCH = {"python": "3.11.7", "torch_error": "ModuleNotFoundError: No module named 'torch'"}
ONE_GPU = {"python": "3.11.7", "torch": "2.14.1", "device_count": 1, "nccl_available": True,
           "devices": [{"index": 0, "name": "H200", "bf16": True, "total_memory": 150 << 30}]}
LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000}


def context(facts: dict | None = None, **options) -> Context:
    ctx = Context(Options(**options))
    if facts is not None:
        ctx.__dict__["facts"] = Facts(facts)  # what the facts worker would have said
    return ctx


def ran(calls):
    def run(ctx):
        calls.append("run")
        return result("t.probe", "Test", "ran")
    return run


def test_the_runner_stamps_id_title_and_duration_on_a_verdict():
    def slow(ctx):
        return verdict("ok", metrics={"n": 1}, details=["ran"])

    res = run_probe(Probe("t.probe", "Test", slow), context())
    assert isinstance(res, ProbeResult) and (res.id, res.title, res.status) == ("t.probe", "Test", Status.PASS)
    assert res.duration_s > 0
    assert set(res.to_json()) == {"id", "status", "title", "summary", "findings", "metrics", "details", "duration_s"}
    warn = Finding("MGD201", "tight", "docker run --shm-size=16g", Status.WARN)
    assert run_probe(Probe("t.probe", "Test", lambda ctx: verdict("x", [warn])), context()).status is Status.WARN


def test_skipped_is_said_once_by_the_runner():
    res = run_probe(Probe("t.probe", "Test", lambda ctx: skip("needs a model")), context())
    assert (res.status, res.summary) == (Status.SKIP, "skipped: needs a model")
    # a skip that found something on the way: the finding decides the status, the summary still says skipped
    bad = Finding("MGD603", "a pre-quantized checkpoint", "use ZeRO-2")
    res = run_probe(Probe("t.probe", "Test", lambda ctx: skip("cannot import torch", [bad])), context())
    assert (res.status, res.summary) == (Status.FAIL, "skipped: cannot import torch")
    # a whole result written the old way keeps its one prefix
    old = run_probe(Probe("t.probe", "Test", lambda ctx: result("t.probe", "Test", "skipped: no GPU",
                                                                    status=Status.SKIP)), context())
    assert old.summary == "skipped: no GPU"


def test_a_reason_from_applies_skips_without_running():
    calls = []
    res = run_probe(Probe("t.probe", "Test", ran(calls), applies=lambda ctx: "needs 3 GPUs, 0 visible"), context())
    assert res.status is Status.SKIP and res.summary == "skipped: needs 3 GPUs, 0 visible"
    assert (res.id, res.title) == ("t.probe", "Test") and calls == []
    res = run_probe(Probe("t.probe", "Test", ran(calls), applies=lambda ctx: None), context())
    assert res.status is Status.PASS and calls == ["run"]


def test_a_crash_in_applies_is_an_error_row_not_a_traceback():
    calls = []

    def broken(ctx):
        raise KeyError("device_count")

    res = run_probe(Probe("t.probe", "Test", ran(calls), applies=broken), context())
    assert res.status is Status.ERROR and calls == []
    assert res.summary == "the probe crashed in applies(): KeyError: 'device_count'"
    assert any("KeyError" in line for line in res.details)
    assert would_skip(Probe("t.probe", "Test", ran(calls), applies=broken), context()).startswith("cannot tell:")


def test_bad_input_found_by_applies_still_stops_the_command():
    def bad(ctx):
        raise DoctorError("train.yaml: not valid YAML")

    with pytest.raises(DoctorError):
        run_probe(Probe("t.probe", "Test", ran([]), applies=bad), context())


def test_the_guards_keep_their_skip_texts(tmp_path):
    none = context()
    assert run_probe(config_deepspeed.PROBE, none).summary == \
        "skipped: no run config given (mgft-doctor check train.yaml or ds_config.json)"
    assert run_probe(config_memory.PROBE, none).summary == \
        "skipped: no model given (--model, or model_name_or_path in the YAML)"
    assert run_probe(config_zero3_guards.PROBE, none).summary == \
        "skipped: no LLaMA-Factory YAML given (mgft-doctor check train.yaml)"
    assert run_probe(zero3_model.PROBE, none).summary == \
        "skipped: no model given (--model PATH_OR_ID, or model_name_or_path in the YAML)"
    assert run_probe(nccl_p2p.PROBE, context(ONE_GPU)).summary == "skipped: needs 2 GPUs, 1 visible"
    empty = tmp_path / "empty-model"
    empty.mkdir()
    assert run_probe(config_memory.PROBE, context(model=str(empty))).summary == f"skipped: {empty} has no config.json"
    (empty / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": "wide"}))
    assert run_probe(config_memory.PROBE, context(model=str(empty))).summary.startswith(
        f"skipped: cannot read the architecture from {empty / 'config.json'} (")


def test_zero3_model_guards_in_their_order(tmp_path):
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA))
    yml = tmp_path / "train.yaml"
    yml.write_text(f"model_name_or_path: {model}\nstage: sft\ndeepspeed: nowhere/ds_z3.json\n")
    missing = f"the DeepSpeed config 'nowhere/ds_z3.json' named in {yml} was not found"
    assert run_probe(zero3_model.PROBE, context(NO_TORCH, config=str(yml))).summary == \
        f"skipped: {missing} (config.deepspeed reports it)"
    assert run_probe(config_zero3_guards.PROBE, context(config=str(yml))).summary == \
        f"skipped: {missing} (config.deepspeed reports it)"
    assert run_probe(zero3_model.PROBE, context(NO_TORCH, model=str(model))).summary == \
        "skipped: torch is not importable in the examined Python (gpu.visible reports it)"
    assert run_probe(zero3_model.PROBE, context(ONE_GPU, model=str(tmp_path / "nope"))).summary == \
        f"skipped: cannot read the model's config.json: {tmp_path / 'nope'}: no such folder"


def test_list_says_why_a_probe_would_skip(tmp_path, capsys):
    from mgft_doctor.check.registry import all_probes

    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 3}}')
    list_probes(all_probes(), context(ONE_GPU, config=str(ds)))
    lines = capsys.readouterr().out.splitlines()
    after = {lines[i].split()[0]: lines[i + 1].strip() for i in range(len(lines) - 1)
             if lines[i + 1].startswith(" ")}
    assert after == {"nccl.p2p": "would skip: needs 2 GPUs, 1 visible",
                     "config.llamafactory": "would skip: no LLaMA-Factory YAML given (mgft-doctor check train.yaml)",
                     "config.memory": "would skip: no model given (--model, or model_name_or_path in the YAML)",
                     "config.zero3_guards": "would skip: no LLaMA-Factory YAML given (mgft-doctor check train.yaml)",
                     "zero3.model": "would skip: no model given (--model PATH_OR_ID, or model_name_or_path in the YAML)",
                     "rehearsal.run": "would skip: not asked for: add --rehearse (a real miniature run, a minute or more)"}


def test_list_without_a_config_asks_no_probe(run_doctor):
    code, out, err = run_doctor("--list")
    assert code == 0 and "would skip" not in out
    assert [ln.split()[0] for ln in out.splitlines()][:2] == ["gpu.visible", "nccl.shm"]


# ---- the concurrent runner (run_all) -------------------------------------------------------------

def _timed_probe(pid: str, spans: dict, seconds: float, ranks: bool = False, needs: tuple = ()):
    import time

    def run(ctx):
        t0 = time.monotonic()
        time.sleep(seconds)
        spans[pid] = (t0, time.monotonic(), [n for n in needs if n in ctx.results])
        return verdict("ok")
    return Probe(pid, pid, run, needs=needs, ranks=ranks)


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_probes_without_ranks_run_beside_the_rank_lane_which_runs_one_at_a_time():
    import time

    from mgft_doctor.check.runner import run_all

    spans: dict = {}
    probes = [_timed_probe("gpu.visible", spans, 0.05),
              _timed_probe("nccl.allreduce", spans, 0.6, ranks=True, needs=("gpu.visible",)),
              _timed_probe("deepspeed.install", spans, 0.6),
              _timed_probe("deepspeed.ops", spans, 0.3, needs=("deepspeed.install",)),
              _timed_probe("versions.compat", spans, 0.6),
              _timed_probe("zero3.model", spans, 0.3, ranks=True, needs=("nccl.allreduce",))]
    started, done = [], []
    t0 = time.monotonic()
    results = run_all(probes, context(ONE_GPU), on_start=lambda p: started.append(p.id),
                      on_done=lambda r: done.append(r.id))
    wall = time.monotonic() - t0
    assert [r.id for r in results] == [p.id for p in probes] and all(r.status is Status.PASS for r in results)
    assert sorted(started) == sorted(done) == sorted(p.id for p in probes)
    assert wall < 1.5, wall  # 2.45 s one after another
    assert _overlap(spans["nccl.allreduce"], spans["deepspeed.install"])
    assert _overlap(spans["deepspeed.install"], spans["versions.compat"])
    assert not _overlap(spans["nccl.allreduce"], spans["zero3.model"])  # the ranks and ports are one lane's
    for pid, (start, _, seen) in spans.items():  # each started after what it needs had finished
        need = {p.id: p.needs for p in probes}[pid]
        assert seen == list(need) and all(spans[n][1] <= start for n in need), pid


def test_serial_when_asked_and_a_needed_failure_still_skips():
    from mgft_doctor.check.runner import run_all

    spans: dict = {}
    failing = Probe("nccl.allreduce", "x", lambda ctx: verdict("no", [Finding("MGD301", "hung", "fix")]), ranks=True)
    probes = [_timed_probe("gpu.visible", spans, 0.01), failing,
              _timed_probe("zero3.model", spans, 0.01, ranks=True, needs=("nccl.allreduce",))]
    for parallel in (True, False):
        res = run_all(probes, context(ONE_GPU), parallel=parallel)
        assert [r.status for r in res] == [Status.PASS, Status.FAIL, Status.SKIP]
        assert res[2].summary == "skipped: needs nccl.allreduce, which did not pass"


def test_an_early_probe_runs_beside_the_facts_and_what_it_needs_and_a_failed_need_still_turns_it_into_a_skip():
    """deepspeed.ops starts at once, beside gpu.visible (which reads the facts) and deepspeed.install
    (its workers import torch and DeepSpeed themselves); when the install fails, the ops' own result
    is not shown: the usual needs-skip is."""
    import dataclasses

    from mgft_doctor.check.runner import run_all

    for install_passes in (True, False):
        spans: dict = {}

        def install(ctx, spans=spans, ok=install_passes):
            import time
            t0 = time.monotonic()
            time.sleep(0.4)
            spans["deepspeed.install"] = (t0, time.monotonic())
            return verdict("ok") if ok else verdict("no", [Finding("MGD907", "deepspeed missing", "install it")])

        ops = dataclasses.replace(_timed_probe("deepspeed.ops", spans, 0.4, needs=("deepspeed.install",)), early=True)
        probes = [_timed_probe("gpu.visible", spans, 0.3), Probe("deepspeed.install", "x", install), ops]
        res = run_all(probes, context(ONE_GPU))
        assert _overlap(spans["gpu.visible"], spans["deepspeed.ops"])
        assert _overlap(spans["deepspeed.install"], spans["deepspeed.ops"])
        if install_passes:
            assert [r.status for r in res] == [Status.PASS, Status.PASS, Status.PASS]
        else:
            assert [r.status for r in res] == [Status.PASS, Status.FAIL, Status.SKIP]
            assert res[2].summary == "skipped: needs deepspeed.install, which did not pass"


def test_bad_input_in_one_probe_stops_the_runs_of_the_others_at_once(tmp_path):
    """A DoctorError (or Ctrl-C in the main thread) ends the command: the run another thread waits
    on is killed (launch.processes.stop_all_runs), not waited for."""
    import sys
    import time
    import uuid

    from mgft_doctor.check.runner import run_all
    from mgft_doctor.launch.processes import TOKEN_VAR, processes_with_token, run_limited

    token = uuid.uuid4().hex

    def runs(code: str):
        def run(ctx):
            with open(tmp_path / "log", "wb") as log:
                rc, *_ = run_limited([sys.executable, "-c", code], dict(__import__("os").environ, **{TOKEN_VAR: token}),
                                     tmp_path, 120, token, log)
            return verdict(f"exit {rc}")
        return run

    long_run = runs("import time; time.sleep(60)")

    def bad(ctx):
        time.sleep(1.0)
        raise DoctorError("train.yaml: not valid YAML")

    probes = [Probe("gpu.visible", "g", lambda ctx: verdict("ok")), Probe("nccl.allreduce", "a", long_run, ranks=True),
              Probe("config.deepspeed", "c", bad)]
    t0 = time.monotonic()
    with pytest.raises(DoctorError, match="not valid YAML"):
        run_all(probes, context(ONE_GPU))
    assert time.monotonic() - t0 < 20
    assert processes_with_token(token) == []
    # and the next run_all in this process starts runs again
    again = run_all([probes[0], Probe("nccl.allreduce", "a", runs("pass"), ranks=True)], context(ONE_GPU))
    assert again[1].summary == "exit 0"
