"""deepspeed.ops: a real JIT build and load of the DeepSpeed ops the run needs (fused Adam on
GPUs; CPU Adam when offloading the optimizer, and on the CPU accelerator; async_io when
offloading to NVMe), each run once on a tiny tensor. ds_report calls ops "compatible" that then
fail to build; this builds them, in the doctor's own cache, under the time limit. A failed build
reports the compiler's own error line and the catalog code that `explain` gives the build log."""

from __future__ import annotations

import glob
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mgft_doctor.check.context import Context
from mgft_doctor.check.facts import gpus_likely
from mgft_doctor.check.launch_findings import explain_log
from mgft_doctor.check.probe import Finding, Probe, Status, verdict
from mgft_doctor.check.shared import Limit
from mgft_doctor.launch import worker_script
from mgft_doctor.launch.script import ScriptRun, run_script
from mgft_doctor.runconfig import RunConfig

from . import _codes

ID, TITLE = "deepspeed.ops", "DeepSpeed ops: real JIT build"
# The compiler's own diagnostics first (gcc/clang/nvcc/ld), then ninja's summary of the failed step.
_COMPILER_LINE = re.compile(r"(?:fatal error|\berror:|nvcc fatal|cannot find -l\S+|undefined symbol|undefined reference)")
_NINJA_LINE = re.compile(r"^FAILED:")
_GENERIC_FIX = ("Read the compiler line above (`mgft-doctor -v` shows the whole build log). The usual causes: no "
                "C++ compiler or one nvcc does not support, missing Python headers (python3-dev), a CUDA toolkit "
                "whose major version differs from torch's, missing CUDA libraries (libcurand) under CUDA_HOME.")


def key_error_line(text: str) -> str | None:
    """The line a person needs from a build log: the compiler's first error, else ninja's FAILED step."""
    lines = [ln.strip() for ln in text.splitlines()]
    for pattern in (_COMPILER_LINE, _NINJA_LINE):
        for ln in lines:
            if pattern.search(ln):
                return ln[:400]
    return None


def _fix_for(line: str, op: str) -> str:
    low = line.lower()
    if "python.h" in low:
        return "Install Python's headers for this interpreter (apt install python3-dev / python3.X-dev), or use a conda or pyenv Python, which ships them."
    if "cannot find -l" in low or "curand" in low or "cudart" in low:
        return ("The CUDA libraries the op links against are missing: install the full CUDA toolkit matching torch "
                "(not only the runtime) and set CUDA_HOME to it, or add its lib64 folder to LIBRARY_PATH.")
    if "unsupported gnu version" in low or "unsupported clang version" in low:
        return "Your gcc is newer than this nvcc supports: point CC/CXX at a supported gcc (e.g. CXX=g++-11) or install a newer CUDA toolkit."
    if "not found" in low and ("c++" in low or "g++" in low or "/bin/sh" in low):
        return "No working C++ compiler: install g++ (apt install build-essential / conda install gxx_linux-64) or set CXX to one."
    return _GENERIC_FIX


def _where(traceback_text: str) -> str | None:
    """'builder.py:712 in compute_capability_args': the innermost frame of a Python traceback."""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', traceback_text or "")
    if not frames:
        return None
    path, line, func = frames[-1]
    return f"{os.path.basename(path)}:{line} in {func}"


def _build_failure(op: str, run: ScriptRun, data: dict) -> Finding:
    text = "\n".join((run.log, data.get("error") or "", data.get("traceback") or ""))
    line = key_error_line(run.log + "\n" + (data.get("error") or ""))
    if line is None:  # no compiler ran: DeepSpeed's builder itself raised before or around the build
        where = _where(data.get("traceback") or "")
        line = f"{data.get('error_type')}: {(data.get('error') or '').strip()[:300]}" + (f" (at {where})" if where else "")
    arch = data.get("torch_cuda_arch_list")
    if arch and "compute_capability" in (data.get("traceback") or ""):
        return Finding(_codes.ARCH_LIST_UNPARSEABLE,
                       f"{op} failed to build: DeepSpeed {data.get('deepspeed', '')} cannot use TORCH_CUDA_ARCH_LIST={arch!r}: {line}",
                       "Give DeepSpeed plain X.Y[+PTX] entries for the build (e.g. TORCH_CUDA_ARCH_LIST=\"9.0\" for H100/H200; "
                       "suffixed archs such as 9.0a are not parsed), or unset it so DeepSpeed reads the GPU's own capability.")
    report = explain_log(text) if text.strip() else None
    if report is not None and report.diagnoses:
        d = report.diagnoses[0]
        return Finding(d.code, f"{op} failed to build: {line}", d.fixes[0] if d.fixes else _fix_for(line, op))
    return Finding(_codes.OP_BUILD_FAILED, f"{op} failed to build: {line}", _fix_for(line, op))


def _incompatible(op: str, run: ScriptRun, data: dict) -> Finding:
    reasons = [ln.strip() for ln in run.log.splitlines()
               if "WARNING" in ln and "accelerator" not in ln and "No CUDA runtime" not in ln]
    why = reasons[0] if reasons else (data.get("error_log") or data.get("error") or "")
    if op == "async_io":
        fix = ("Install libaio with its headers (apt install libaio-dev, or conda install -c conda-forge libaio and set "
               "CFLAGS/LDFLAGS to its include/lib), then rerun; or offload to cpu instead of nvme.")
    else:
        fix = _GENERIC_FIX
    code = _codes.AIO_MISSING if op == "async_io" else _codes.OP_BUILD_FAILED
    return Finding(code, f"{op} cannot be built here: DeepSpeed's builder says it is not compatible"
                   + (f" ({why[:300]})" if why else ""), fix)


def run(ctx: Context):
    """Starts at once (Probe.early). In a check the ops are the shared worker's last sections (see
    shares). Alone, on what the machine's device nodes suggest (gpus_likely): the op workers take
    seconds to import torch and DeepSpeed, as long as the facts take to arrive; when the facts then
    disagree, the ops the machine really needs and that have not run yet run after."""
    o = ctx.options
    config = ctx.run_config or RunConfig()
    t0 = time.monotonic()
    deadline = t0 + o.timeout
    shared = ctx.shared
    if shared is not None and shared.asked("op:"):
        ops, runs = _shared_runs(ctx, config, shared, deadline)
    else:
        guess = gpus_likely()
        ops = config.deepspeed_ops(guess)
        runs = dict(_run_workers([n for n, _ in ops], o, deadline))
        gpu = ctx.facts.gpu_count > 0
        if gpu != guess:
            ops = config.deepspeed_ops(gpu)
            runs.update(_run_workers([n for n, _ in ops if n not in runs], o, deadline))
    gpu = ctx.facts.gpu_count > 0
    if not ops:
        return verdict("nothing to JIT-build for this run: the HF Trainer supplies a torch optimizer (no optimizer "
                       "section in the DeepSpeed JSON, no offload) or the run does not use DeepSpeed",
                       metrics={"ops": {}}, details=["ops this run needs: none"])
    findings: list[Finding] = []
    where = f"run config {o.config or o.deepspeed}" if ctx.run_config is not None else "no run config"
    details = [f"ops this run needs ({'GPU' if gpu else 'CPU accelerator'}, {where}):"]
    details += [f"  {n}: {why}" for n, why in ops]
    metrics: dict = {"ops": {}}
    done: list[tuple[str, str]] = []  # (op, how it built and ran)
    for name, _ in ops:
        run_ = runs[name]
        if run_ is None:
            findings.append(Finding(_codes.OP_BUILD_HANG, f"{name} was not built: the time limit ({o.timeout:.0f} s) "
                                    "was spent on the ops before it", "Rerun with a larger --timeout (a first build takes a minute or more)."))
            continue
        if run_.timed_out:
            _clear_locks(_cache_root(o), name)
        op = judge_op(name, run_)
        if ctx.run_config is None:  # say which runs the failure stops: not every run builds every op
            for f in op.findings:
                f.message += f" (without a run config: affects {affected_runs(name, gpu, dict(ops)[name])})"
        metrics["ops"][name] = op.metrics
        if (run_.payload or {}).get("ext_dir"):
            metrics["cache_dir"] = run_.payload["ext_dir"]
        findings += op.findings
        details += op.details
        if op.ran:
            done.append((name, op.ran))
    metrics["wall_s"] = round(time.monotonic() - t0, 2)
    if metrics.get("cache_dir"):
        details.append(f"cache: {metrics['cache_dir']}")
    ran_ok = ", ".join(text for _, text in done)
    if findings:
        failed = [n for n, _ in ops if n not in {name for name, _ in done}]
        summary = f"{', '.join(failed)} did not build and run" + (f"; built and ran {ran_ok}" if done else "")
    else:
        summary = f"built, loaded and ran {ran_ok}"
    return verdict(summary, findings, metrics, details)


def affected_runs(name: str, gpu: bool, why: str) -> str:
    """The runs an op's failure stops when check was given no run config (what builds the op)."""
    if name == "fused_adam":
        return ("runs whose DeepSpeed JSON names an Adam/AdamW optimizer without offload; LLaMA-Factory's own "
                "ds_z*_config.json have no optimizer section and build nothing")
    if name == "cpu_adam":
        return ("runs that offload the optimizer to the CPU (offload_optimizer)" if gpu else
                "DeepSpeed runs on this CPU accelerator that use DeepSpeed's Adam or optimizer offload")
    return why


def shares(ctx: Context):
    """The ops' builds are the shared worker's last sections (Probe.shares): it has imported torch
    and DeepSpeed by then. It builds the ops for a GPU when torch sees one there, else those for
    the CPU accelerator, as run() picks them from the facts; where builds run side by side
    (SIDE_BY_SIDE_CPUS), the ops after the first of the device nodes' guess build in workers of
    their own, started at once."""
    o = ctx.options
    config = ctx.run_config or RunConfig()
    guess = gpus_likely()
    ops_gpu, ops_cpu = [n for n, _ in config.deepspeed_ops(True)], [n for n, _ in config.deepspeed_ops(False)]
    likely = ops_gpu if guess else ops_cpu
    elsewhere = likely[1:] if len(likely) > 1 and (os.cpu_count() or 1) >= SIDE_BY_SIDE_CPUS else []
    args = {"ops_gpu": ops_gpu, "ops_cpu": ops_cpu, "elsewhere": elsewhere, "gpus_likely": guess,
            "cache_root": _cache_root(o), "workdir": _aio_dir(o, ops_gpu + ops_cpu)}
    busy = None if o.hard_timeout else max(o.timeout, BUILD_BUSY_LIMIT_S)
    return args, [Limit("op:", o.timeout, busy, group="ops")]


def _shared_runs(ctx: Context, config: RunConfig, shared, deadline: float):
    """(the ops the facts call for, each op's run): from the shared worker's sections, from the
    workers started beside it (`elsewhere`), and from workers of their own for any op neither
    reached (the worker stopped or died before it; the facts differ from the device nodes' guess)."""
    o = ctx.options
    beside = list(shared.args.get("elsewhere") or [])
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mgft-ds-op-beside") as pool:
        side = pool.submit(lambda: dict(_run_workers(beside, o, deadline, side_by_side=True))) if beside else None
        gpu = ctx.facts.gpu_count > 0
        ops = config.deepspeed_ops(gpu)
        runs = {n: shared.section(f"op:{n}") for n, _ in ops if n not in beside}
        if side is not None:
            runs.update(side.result())
    missing = [n for n, _ in ops if runs.get(n) is None]
    runs.update(_run_workers(missing, o, deadline))
    return ops, runs


def _aio_dir(o, names) -> str:
    workdir = os.path.join(o.cache_dir, "aio-probe")
    if "async_io" in names:
        os.makedirs(workdir, exist_ok=True)
    return workdir


def _cache_root(o) -> str:
    root = os.path.join(o.cache_dir, "torch_extensions")
    os.makedirs(root, exist_ok=True)
    return root


# A first build is a minute on a few idle cores and several on a loaded one; while its compiler
# keeps working it goes on past the time limit, up to this (a build waiting on a lock is idle and
# is stopped at the limit as before).
BUILD_BUSY_LIMIT_S = 1800.0
SIDE_BY_SIDE_CPUS = 8  # with fewer cores, builds side by side would each take as long as all of them


def _run_workers(names: list[str], o, deadline: float, side_by_side: bool = False):
    """(op, its worker's run) for each op, in the given order. Each op's worker imports DeepSpeed
    and builds (or loads) it in its own process, so on a machine with cores to spare they run side
    by side, each under the whole time limit; otherwise one after another, each getting what the
    ones before it left (None for an op with no time left)."""
    cache_root = _cache_root(o)

    def one(name: str, left: float) -> ScriptRun:
        args = {"op": name, "cache_root": cache_root, "workdir": os.path.join(o.cache_dir, "aio-probe")}
        if name == "async_io":
            os.makedirs(args["workdir"], exist_ok=True)
        return run_script(o.python, worker_script("ds_ops"), args, timeout=left,
                          busy_limit=None if o.hard_timeout else max(left, BUILD_BUSY_LIMIT_S))

    if len(names) > 1 and (side_by_side or (os.cpu_count() or 1) >= SIDE_BY_SIDE_CPUS):
        with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="mgft-ds-op") as pool:
            runs = [pool.submit(one, n, deadline - time.monotonic()) for n in names]
            yield from zip(names, (r.result() for r in runs))
        return
    for name in names:
        left = deadline - time.monotonic()
        yield name, (one(name, left) if left >= 5 else None)


@dataclass
class OpVerdict:
    """What one op's worker run shows: its findings and detail lines, its entry under
    metrics["ops"], and "cpu_adam (fresh build, 41.3 s)" when it built, loaded and ran."""

    findings: list[Finding]
    details: list[str]
    metrics: dict
    ran: str | None = None

    def add(self, findings: list[Finding], details: list[str]) -> None:
        self.findings += findings
        self.details += details


def judge_op(name: str, run: ScriptRun) -> OpVerdict:
    """One branch per stage the worker reached: killed at the time limit, died without a payload,
    DeepSpeed not loadable, builder not compatible, build failed, run failed, ran."""
    data = run.payload or {}
    op = OpVerdict([], [f"{name}: {' → '.join(run.phases) or 'no phase reached'}, {run.wall_s:.1f} s, exit code {run.returncode}"],
                   {"wall_s": round(run.wall_s, 2)})
    stage = data.get("stage")
    if run.timed_out:
        op.add(*_timed_out(name, run))
    elif not run.payload:
        op.add(*_died(name, run))
    elif stage in ("import", "builder"):
        op.add(_not_loaded(name, data), [])
    elif stage == "is_compatible":
        op.add([_incompatible(name, run, data)], _log_tail(run.log, 8))
    else:
        op.metrics.update(build_s=data.get("build_s"), cached=data.get("cached"), prebuilt=data.get("prebuilt"))
        if stage == "build":
            op.add(*_build_failed(name, run, data))
            return op
        how = "pre-built" if data.get("prebuilt") else ("cached build" if data.get("cached") else "fresh build")
        op.details.append(f"  {how}: {data.get('module_file')}, load {data.get('build_s')} s")
        ran = data.get("ran") or {}
        if stage == "run":
            op.metrics["ran"] = False
            op.add([_run_failed(name, data)], [f"  run: {ran.get('what', '')}"])
        else:
            op.metrics.update(ran=not ran.get("skipped", False), run_s=data.get("run_s"))
            op.details.append(f"  ran: {ran.get('what')}" + (f" → {ran.get('values')}" if ran.get("values") else ""))
            op.ran = f"{name} ({how}, {data.get('build_s', 0):.1f} s)"
    return op


def _timed_out(name: str, run: ScriptRun) -> tuple[list[Finding], list[str]]:
    at = run.phases[-1] if run.phases else "start"
    if run.wall_s >= BUILD_BUSY_LIMIT_S - 1:
        why = f"still compiling after {BUILD_BUSY_LIMIT_S:.0f} s"
        fix = ("The build kept compiling for half an hour: the machine is overloaded; rerun when it is "
               f"idle, or pre-build the op (DS_BUILD_{name.upper()}=1 pip install deepspeed).")
    else:
        why = f"no result within {run.wall_s:.0f} s"
        fix = ("A first build takes about a minute on a few idle cores, several on a loaded one: rerun "
               "without --timeout (a build that is still compiling then goes on) or with a larger one. "
               "A build that uses no CPU waits on something: most often a `lock` left in a "
               "torch_extensions folder by a killed build (torch < 2.14 waits on its mere existence): delete it.")
    return [Finding(_codes.OP_BUILD_HANG, f"{name}: {why} (stopped at '{at}'); the build was killed", fix)], \
        _log_tail(run.log)


def _died(name: str, run: ScriptRun) -> tuple[list[Finding], list[str]]:
    """No payload: the worker (or the build it ran in-process) died; explain reads its output."""
    report = explain_log(run.log) if run.log.strip() else None
    code = report.diagnoses[0].code if report is not None and report.diagnoses else _codes.OP_BUILD_FAILED
    line = key_error_line(run.log) or (run.log.strip().splitlines() or ["no output"])[-1]
    return [Finding(code, f"{name}: the build process died (exit code {run.returncode}) without a result: {line[:300]}",
                    _fix_for(line, name))], _log_tail(run.log)


def _not_loaded(name: str, data: dict) -> list[Finding]:
    return [Finding(_codes.DS_IMPORT_FAILED, f"{name}: DeepSpeed could not be loaded to build it: "
                    f"{data.get('error_type')}: {(data.get('error') or '')[:300]}",
                    "See deepspeed.install: DeepSpeed must import in this environment first.")]


def _build_failed(name: str, run: ScriptRun, data: dict) -> tuple[list[Finding], list[str]]:
    details = _log_tail(run.log)
    if data.get("traceback"):
        details += ["traceback (tail):", *("  " + ln[:300] for ln in data["traceback"].strip().splitlines()[-8:])]
    return [_build_failure(name, run, data)], details


def _run_failed(name: str, data: dict) -> Finding:
    sev = Status.WARN if name == "async_io" else Status.FAIL
    return Finding(_codes.OP_BUILD_FAILED,
                   f"{name} built and loaded, but running it failed: {data.get('error_type')}: "
                   f"{(data.get('error') or '')[:300]}",
                   "For async_io: the folder must be on a filesystem with O_DIRECT (not tmpfs); otherwise "
                   "rebuild the op (delete the cache folder) and check the driver."
                   if name == "async_io" else
                   "The op loads but computes wrongly or crashes: delete the torch_extensions cache and rebuild; "
                   "check that torch, DeepSpeed and the compiler match.", sev)


def _clear_locks(cache_root: str, op: str) -> None:
    """A build killed at the time limit may leave torch's `lock` file (torch < 2.14 waits on its mere
    existence); only the doctor's own cache is touched."""
    for lock in glob.glob(os.path.join(cache_root, "*", op, "lock")):
        try:
            os.remove(lock)
        except OSError:
            pass


def _log_tail(log: str, n: int = 25) -> list[str]:
    lines = [ln for ln in log.strip().splitlines() if ln.strip()][-n:]
    return ["build log (tail):", *("  " + ln[:300] for ln in lines)] if lines else []


# early: the op workers import torch and DeepSpeed themselves, so they start beside the facts and
# deepspeed.install (whose failure, torch or DeepSpeed missing among them, still turns this into a skip)
PROBE = Probe(ID, TITLE, run, needs=("deepspeed.install",), slow=True, early=True, shares=shares,
              hint="a first JIT build takes about a minute, then it is cached")
