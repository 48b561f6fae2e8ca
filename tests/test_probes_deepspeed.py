"""deepspeed.install and deepspeed.ops, for real: the probes examine this environment (torch,
DeepSpeed 0.19, no GPU: the CPU accelerator) and environments made broken for real (a bare venv
without DeepSpeed, a bogus CUDA_HOME, a compiler that cannot find a header, a time limit too
short for a build). deepspeed.ops really JIT-builds cpu_adam, once per session, in a cache of
the session's own."""

import os
import sys
import time
import venv

import pytest
from mgft_doctor.catalog import find_entry
from mgft_doctor.check.context import Context, Options
from mgft_doctor.check.probe import Status
from mgft_doctor.probes import _codes, deepspeed_install, deepspeed_ops
from mgft_doctor.check.runner import run_probe
from mgft_doctor.runconfig import RunConfig
from recorded_runs import payload, recorded

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def gpu():
    return Context(Options()).facts.gpu_count > 0


@pytest.fixture(autouse=True)
def activated_env(monkeypatch):
    """What `source .venv/bin/activate` does: the environment's bin folder (its ninja) on PATH."""
    monkeypatch.setenv("PATH", BIN + os.pathsep + os.environ.get("PATH", ""))
    for var in ("CUDA_HOME", "CUDA_PATH", "DS_ACCELERATOR", "CXX", "CPLUS_INCLUDE_PATH", "TORCH_EXTENSIONS_DIR"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="session")
def ds_cache(tmp_path_factory):
    """The doctor's cache for this session: cpu_adam is built into it once."""
    return str(tmp_path_factory.mktemp("mgft-doctor-cache"))


def probe(module, python=sys.executable, cache_dir=None, timeout=600.0, config=None):
    ctx = Context(Options(python=python, timeout=timeout, cache_dir=cache_dir or os.path.expanduser("~/.cache/mgft-doctor"),
                          config=config))
    return run_probe(module.PROBE, ctx)


def workers_left(folder):
    """Processes still working in (ninja, the compilers: their cwd) or on (the worker: its args) this cache."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if cwd.startswith(folder) or folder in args:
            left.append(f"{pid}: {args[:200]}")
    return left


# deepspeed.install ------------------------------------------------------------------------

def test_install_passes_here_with_the_cpu_accelerator(gpu):
    r = probe(deepspeed_install)
    assert r.status is Status.PASS, (r.summary, r.findings, r.details)
    assert r.metrics["accelerator"] == ("cuda" if gpu else "cpu")
    assert r.metrics["deepspeed"].startswith("0.")
    text = "\n".join(r.details)
    if not gpu:
        assert "nvcc checks skipped: no GPU" in text
        assert "JIT-built here: cpu_adam" in text  # the op the CPU accelerator builds
    assert "deepspeed" in r.summary and f"accelerator {r.metrics['accelerator']}" in r.summary


def test_install_without_deepspeed_is_a_finding_not_a_crash(tmp_path):
    env = tmp_path / "bare"
    venv.create(env, with_pip=False)  # no torch, no deepspeed
    r = probe(deepspeed_install, python=str(env / "bin" / "python"))
    assert r.status is Status.FAIL, (r.summary, r.details)
    f = r.findings[0]
    assert f.code == _codes.DS_MISSING
    assert "not installed" in f.message and "torch is missing too" in f.message
    assert "pip install deepspeed" in f.fix


@pytest.mark.parametrize("value", ["{tmp}/no-such-cuda-12.4", "/usr/local/cuda-12.4:/usr/local/cuda"])
def test_install_fails_on_a_bogus_cuda_home(tmp_path, monkeypatch, value):
    monkeypatch.setenv("CUDA_HOME", value.format(tmp=tmp_path))
    r = probe(deepspeed_install)
    assert r.status is Status.FAIL, (r.summary, r.details)
    bad = [f for f in r.findings if f.code == _codes.CUDA_TOOLKIT_MISSING]
    assert bad and "CUDA_HOME=" in bad[0].message, r.findings
    assert ("does not exist" in bad[0].message) or ("list of paths" in bad[0].message)


def test_install_fails_when_deepspeed_is_forced_onto_cuda_without_a_gpu(monkeypatch, gpu):
    if gpu:
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    r = probe(deepspeed_install)
    assert r.status is Status.FAIL
    assert [f.code for f in r.findings] == [_codes.CPU_ONLY_TORCH]
    assert "DS_ACCELERATOR=cuda" in r.findings[0].message


# deepspeed.install's sections on recorded payloads (fast) ---------------------------------------

def codes_of(findings):
    return [f.code for f in findings]


def test_sections_pass_on_this_machines_payload():
    d = payload("ds_install_here")
    assert deepspeed_install.importable(d, d["executable"])[0::2] == ([], None)
    found, details = deepspeed_install.accelerator(d, gpu=False)
    assert found == [] and details[0].startswith("DeepSpeed accelerator: cpu (auto-detected)")
    ops = RunConfig().deepspeed_ops(gpu=False)
    jit = deepspeed_install.jit_ops(d, ops)
    assert jit == ["cpu_adam"]
    found, details = deepspeed_install.prebuilt_ops(d, d["executable"], False, ops, jit)
    assert found == [] and details[-1] == "ops this run needs: cpu_adam; JIT-built here: cpu_adam"
    assert deepspeed_install.cuda_home(d) == ([], [])
    found, details = deepspeed_install.nvcc_checks(d, gpu=False, jit=jit, bad_home=False)
    assert found == [] and "nvcc checks skipped: no GPU" in details[-1]
    found, details = deepspeed_install.jit_toolchain(d, d["executable"], jit)
    assert found == [] and any(line.startswith("C++ compiler ") for line in details)
    v = deepspeed_install.judge(d, d["executable"], RunConfig(), 1.0)
    assert v.status is Status.PASS and v.summary.endswith("JIT toolchain ready for cpu_adam")


def test_sections_on_payloads_of_broken_environments():
    bare = payload("ds_install_bare")
    found, _, stopped = deepspeed_install.importable(bare, bare["executable"])
    assert codes_of(found) == [_codes.DS_MISSING] and "torch is missing too" in found[0].message
    assert stopped == f"deepspeed is not installed in {bare['executable']}"
    found, _ = deepspeed_install.cuda_home(payload("ds_install_bogus_cuda_home"))
    assert codes_of(found) == [_codes.CUDA_TOOLKIT_MISSING] and "is a list of paths" in found[0].message
    forced = payload("ds_install_forced_cuda")
    found, _ = deepspeed_install.accelerator(forced, gpu=False)
    assert codes_of(found) == [_codes.CPU_ONLY_TORCH] and "DS_ACCELERATOR=cuda" in found[0].message


def test_nvcc_section_as_a_gpu_machine_would_report():
    # this machine's payload as a GPU machine with an older toolkit would send it
    d = payload("ds_install_here", cuda_available=True, device_count=2, accelerator="cuda",
                nvcc=[{"path": "/usr/local/cuda/bin/nvcc", "release": "12.4"}], torch_cuda_home="/usr/local/cuda")
    found, _ = deepspeed_install.nvcc_checks(d, gpu=True, jit=["fused_adam"], bad_home=False)
    assert codes_of(found) == [_codes.NVCC_MISMATCH] and "CUDA 12.4" in found[0].message
    assert deepspeed_install.nvcc_checked(d, gpu=True, bad_home=False)["release"] == "12.4"
    found, _ = deepspeed_install.nvcc_checks(dict(d, nvcc=[]), gpu=True, jit=["fused_adam"], bad_home=False)
    assert codes_of(found) == [_codes.CUDA_TOOLKIT_MISSING] and found[0].severity is Status.WARN
    found, details = deepspeed_install.nvcc_checks(dict(d, nvcc=[{"path": "/x/nvcc", "release": "13.1"}]),
                                                   gpu=True, jit=["fused_adam"], bad_home=False)
    assert found == [] and "a minor mismatch" in details[-1]


# deepspeed.ops' stages on recorded worker runs (fast) --------------------------------------------

def test_a_recorded_build_that_ran():
    op = deepspeed_ops.judge_op("cpu_adam", recorded("ds_ops_cpu_adam"))
    assert op.findings == [] and op.ran.startswith("cpu_adam (fresh build, ")
    assert op.metrics["ran"] is True and op.metrics["prebuilt"] is False and op.metrics["cached"] is False
    assert op.details[0] == "cpu_adam: import → is_compatible → build → run, " + op.details[0].split(", ", 1)[1]
    assert "0.8999" in op.details[-1]


def test_recorded_failures_stage_by_stage():
    op = deepspeed_ops.judge_op("cpu_adam", recorded("ds_ops_cpu_adam_broken_headers"))
    assert op.ran is None and len(op.findings) == 1
    assert "fatal error: mgft_doctor_missing_header.h: No such file or directory" in op.findings[0].message
    assert find_entry(op.findings[0].code).area == "ds-build"
    assert "traceback (tail):" in op.details
    op = deepspeed_ops.judge_op("async_io", recorded("ds_ops_async_io"))
    assert codes_of(op.findings) == [_codes.AIO_MISSING] and "libaio" in op.findings[0].fix
    hung = recorded("ds_ops_cpu_adam")
    hung.timed_out, hung.payload = True, None  # the same build, had the time limit struck during its run
    op = deepspeed_ops.judge_op("cpu_adam", hung)
    assert codes_of(op.findings) == [_codes.OP_BUILD_HANG] and "stopped at 'run'" in op.findings[0].message


# deepspeed.ops --------------------------------------------------------------------------------

def test_key_error_line_prefers_the_compiler_over_ninja():
    log = ("[1/3] c++ -c cpu_adam.cpp -o cpu_adam.o\nFAILED: cpu_adam.o\nIn file included from x.h:1,\n"
           "/usr/include/pybind11/detail/common.h:266:10: fatal error: Python.h: No such file or directory\n"
           "RuntimeError: Error building extension 'cpu_adam'\n")
    assert deepspeed_ops.key_error_line(log).endswith("fatal error: Python.h: No such file or directory")
    assert deepspeed_ops.key_error_line("[1/2] /bin/false -c a.cpp\nFAILED: [code=1] a.o\nninja: build stopped") \
        == "FAILED: [code=1] a.o"
    assert deepspeed_ops.key_error_line("RuntimeError: Error building extension 'x'") is None


def test_needed_ops_follow_the_run_config(tmp_path):
    """The ops DeepSpeed really builds: an Adam optimizer section -> FusedAdam on GPUs, DeepSpeedCPUAdam
    when offloaded; no section under the HF Trainer -> the Trainer's torch optimizer (nothing built),
    except with offload, where accelerate swaps it for DeepSpeedCPUAdam; NVMe -> async_io."""
    import json

    from mgft_doctor.runconfig import RunConfig, load_run_config

    def ops(ds: dict, gpu: bool, yaml: bool = True) -> list[str]:
        (tmp_path / "ds.json").write_text(json.dumps(ds))
        if yaml:
            (tmp_path / "train.yaml").write_text("model_name_or_path: m\nstage: sft\ndeepspeed: ds.json\n")
            rc = load_run_config(str(tmp_path / "train.yaml"))
        else:
            rc = load_run_config(str(tmp_path / "ds.json"))
        return [n for n, _ in rc.deepspeed_ops(gpu)]

    z3 = {"zero_optimization": {"stage": 3}}
    adam = {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    cpu_off = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    nvme_off = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}
    assert [n for n, _ in RunConfig().deepspeed_ops(gpu=True)] == ["fused_adam", "cpu_adam"]  # machine level
    assert [n for n, _ in RunConfig().deepspeed_ops(gpu=False)] == ["cpu_adam"]
    assert ops(z3, gpu=True) == []  # LLaMA-Factory's ds_z3_config.json: nothing JIT-built
    assert ops({**z3, **adam}, gpu=True) == ["fused_adam"]
    assert ops({**cpu_off, **adam}, gpu=True) == ["cpu_adam"]
    assert ops(cpu_off, gpu=True) == ["cpu_adam"]  # accelerate: map_pytorch_optim_to_deepspeed
    assert ops({**cpu_off, "zero_force_ds_cpu_optimizer": False}, gpu=True) == []
    assert ops({**z3, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}, gpu=True) == []
    assert ops(nvme_off, gpu=True) == ["cpu_adam", "async_io"]
    assert ops({**z3, **adam}, gpu=False, yaml=False) == ["cpu_adam"]
    (tmp_path / "plain.yaml").write_text("model_name_or_path: m\nstage: sft\n")
    assert load_run_config(str(tmp_path / "plain.yaml")).deepspeed_ops(gpu=True) == []  # no DeepSpeed at all


@pytest.mark.parametrize("guess, gpus, asked", [
    (True, 0, [["fused_adam", "cpu_adam"]]),  # device nodes but torch sees no GPU: cpu_adam has run already
    (False, 1, [["cpu_adam"], ["fused_adam"]]),  # torch sees a GPU the nodes did not show: fused_adam after
    (True, 1, [["fused_adam", "cpu_adam"]]),
])
def test_ops_start_on_the_device_nodes_guess_and_follow_the_facts(monkeypatch, guess, gpus, asked):
    """deepspeed.ops starts its workers before torch has said whether it sees a GPU (Probe.early);
    the ops it reports are always the ones the facts call for, each built once."""
    from mgft_doctor.check.facts import Facts

    seen: list[list[str]] = []

    def workers(names, o, deadline):
        if names:
            seen.append(list(names))
        yield from ((n, None) for n in names)  # "not built": enough to see what was asked and reported

    monkeypatch.setattr(deepspeed_ops, "_run_workers", workers)
    monkeypatch.setattr(deepspeed_ops, "gpus_likely", lambda: guess)
    ctx = Context(Options())
    ctx.__dict__["facts"] = Facts({"device_count": gpus})
    res = run_probe(deepspeed_ops.PROBE, ctx)
    assert seen == asked
    want = ["fused_adam", "cpu_adam"] if gpus else ["cpu_adam"]
    assert [f.message.split()[0] for f in res.findings] == want
    assert res.details[0].startswith(f"ops this run needs ({'GPU' if gpus else 'CPU accelerator'}")


def test_gpus_likely_reads_the_device_nodes_and_cuda_visible_devices():
    from mgft_doctor.check.facts import gpus_likely

    import glob
    nodes = bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/kfd")
    assert gpus_likely({}) is nodes
    assert gpus_likely({"CUDA_VISIBLE_DEVICES": ""}) is False
    assert gpus_likely({"CUDA_VISIBLE_DEVICES": "-1"}) is False
    assert gpus_likely({"CUDA_VISIBLE_DEVICES": "0,1"}) is nodes


@pytest.mark.slow
def test_ops_really_builds_loads_and_runs_its_adam(ds_cache, gpu):
    op = "fused_adam" if gpu else "cpu_adam"  # what DeepSpeed builds on this machine
    t0 = time.monotonic()
    first = probe(deepspeed_ops, cache_dir=ds_cache)
    took_first = time.monotonic() - t0
    assert first.status is Status.PASS, (first.summary, first.findings, first.details[-30:])
    m = first.metrics["ops"][op]
    assert m["ran"] is True and m["prebuilt"] is False
    assert first.metrics["cache_dir"].startswith(os.path.join(ds_cache, "torch_extensions"))
    assert any("Adam.step()" in d and "0.8999" in d for d in first.details)  # 1 - lr after one step
    t0 = time.monotonic()
    again = probe(deepspeed_ops, cache_dir=ds_cache)
    took_again = time.monotonic() - t0
    assert again.status is Status.PASS
    assert again.metrics["ops"][op]["cached"] is True
    assert "cached build" in again.summary
    print(f"\n{op}: first probe {took_first:.1f} s ({'cached' if m['cached'] else 'fresh build'}, "
          f"load {m['build_s']} s); cached probe {took_again:.1f} s "
          f"(load {again.metrics['ops'][op]['build_s']} s)")


@pytest.mark.slow
def test_a_failing_build_reports_the_compiler_line_and_explains_code(tmp_path, monkeypatch):
    # A broken toolchain for real: system headers shadowed by ones that include a missing file,
    # so g++ stops with its own "fatal error" line (like the classic missing Python.h).
    shadow = tmp_path / "broken-include"
    shadow.mkdir()
    for header in ("cmath", "cstdint", "cstddef", "type_traits", "memory", "string", "vector"):
        (shadow / header).write_text("#include <mgft_doctor_missing_header.h>\n")
    monkeypatch.setenv("CPLUS_INCLUDE_PATH", str(shadow))
    cache = tmp_path / "cache"  # a fresh cache: nothing to reuse
    r = probe(deepspeed_ops, cache_dir=str(cache), timeout=300)
    assert r.status is Status.FAIL, (r.summary, r.details[-20:])
    f = r.findings[0]
    assert "failed to build" in f.message
    assert "fatal error: mgft_doctor_missing_header.h: No such file or directory" in f.message
    assert "(without a run config: affects DeepSpeed runs on this CPU accelerator" in f.message or \
        "(without a run config: affects runs whose DeepSpeed JSON names an Adam" in f.message  # which runs it stops
    # the code is what `explain` gives the build output: a DeepSpeed build entry of the catalog
    entry = find_entry(f.code)
    assert entry is not None and entry.area == "ds-build", f.code
    assert not workers_left(str(cache))


@pytest.mark.slow
def test_a_build_past_the_time_limit_is_killed_with_its_compilers(tmp_path):
    cache = tmp_path / "cache"
    t0 = time.monotonic()
    r = probe(deepspeed_ops, cache_dir=str(cache), timeout=12)
    took = time.monotonic() - t0
    assert r.status is Status.FAIL, (r.summary, r.details)
    f = r.findings[0]
    assert f.code == _codes.OP_BUILD_HANG
    assert "no result within" in f.message and "killed" in f.message
    assert took < 12 + 25  # the limit fired; the kill is bounded
    time.sleep(0.5)
    assert not workers_left(str(cache)), workers_left(str(cache))  # no ninja / cc1plus left behind
    assert not list(cache.glob("torch_extensions/*/*/lock"))


# through the shared worker (doctor/check/shared.py) ---------------------------------------------

def test_ops_the_shared_worker_never_reaches_run_in_workers_of_their_own(tmp_path, monkeypatch):
    """The shared worker answers the facts (no GPU) and dies before its first op: deepspeed.ops runs
    that op in a worker of its own, as it does without the shared worker."""
    import textwrap

    from mgft_doctor.check.shared import Limit, SharedWorker
    from mgft_doctor.launch import workers_dir

    script = tmp_path / "stack.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(workers_dir())!r})
        from _protocol import emit, phase
        phase("section:facts")
        emit({{"section": "facts", "payload": {{"torch": "2.x", "device_count": 0}}}})
        os._exit(3)
    """))
    seen: list[list[str]] = []

    def workers(names, o, deadline, side_by_side=False):
        seen.append(list(names))
        yield from ((n, None) for n in names)

    monkeypatch.setattr(deepspeed_ops, "_run_workers", workers)
    ctx = Context(Options())
    args, limits = deepspeed_ops.shares(ctx)
    ctx.__dict__["shared"] = SharedWorker(sys.executable, args, [Limit("facts", 60), *limits], script=str(script)).start()
    res = run_probe(deepspeed_ops.PROBE, ctx)
    assert seen == [["cpu_adam"]]
    assert [f.message.split()[0] for f in res.findings] == ["cpu_adam"]  # "not built": what the stand-in said
    ctx.close()


@pytest.mark.slow
def test_install_and_ops_through_the_shared_worker(ds_cache):
    """The check's own path: one interpreter reads the facts, examines the install and builds,
    loads and runs cpu_adam (in the session's cache, built once); each probe has its verdict;
    nothing is left running."""
    from mgft_doctor.check.runner import run_all
    from mgft_doctor.launch.processes import processes_with_token
    from mgft_doctor.probes import gpu_visible

    ctx = Context(Options(cache_dir=ds_cache, timeout=600.0))
    results = run_all([gpu_visible.PROBE, deepspeed_install.PROBE, deepspeed_ops.PROBE], ctx)
    worker = ctx.__dict__["shared"]
    assert worker is not None and worker.ended and processes_with_token(worker.token) == []
    by_id = {r.id: r for r in results}
    assert by_id["deepspeed.install"].status is Status.PASS, by_id["deepspeed.install"].findings
    ops = by_id["deepspeed.ops"]
    assert ops.status is Status.PASS, (ops.findings, ops.details)
    assert ops.metrics["ops"]["cpu_adam"]["ran"] is True
    assert ctx.facts.torch_ok and by_id["gpu.visible"].status in (Status.PASS, Status.WARN)
