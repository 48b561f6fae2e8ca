"""Run probes in order, honour what each needs, ask each whether it applies before running it,
stamp the probe's id, title and duration on what run() decides (and "skipped: " on a skip), and
turn a crashing probe (in applies() or run()) into an `error` result instead of a traceback."""

from __future__ import annotations

import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Callable

from .context import Context
from ..errors import DoctorError
from .probe import Probe, ProbeResult, Status, Verdict

SKIP_PREFIX = "skipped: "  # every skip summary starts so (the rows and the JSON show it)


def run_probe(probe: Probe, ctx: Context) -> ProbeResult:
    skip = unmet_need(probe, ctx)
    if skip is not None:
        return skip
    t0 = time.perf_counter()
    res = _applies_then_run(probe, ctx)
    res.duration_s = time.perf_counter() - t0
    return res


def unmet_need(probe: Probe, ctx: Context) -> ProbeResult | None:
    """The skip of a probe one of whose needs finished without passing, else None."""
    for need in probe.needs:
        done = ctx.results.get(need)
        if done is not None and done.status in (Status.FAIL, Status.ERROR):
            return stamp(probe, Verdict(Status.SKIP, f"needs {need}, which did not pass", skipped=True))
    return None


def stamp(probe: Probe, v: Verdict | ProbeResult) -> ProbeResult:
    """The probe's identity on its verdict; a skip's summary says "skipped: " once, whoever wrote it."""
    summary = v.summary
    if (v.status is Status.SKIP or getattr(v, "skipped", False)) and not summary.startswith(SKIP_PREFIX):
        summary = SKIP_PREFIX + summary
    return ProbeResult(probe.id, probe.title, v.status, summary, v.findings, v.metrics, v.details)


def _applies_then_run(probe: Probe, ctx: Context) -> ProbeResult:
    stage = "applies()"
    try:
        reason = probe.applies(ctx) if probe.applies is not None else None
        if reason is not None:
            return stamp(probe, Verdict(Status.SKIP, reason, skipped=True))
        stage = ""
        return stamp(probe, probe.run(ctx))
    except DoctorError:
        raise  # bad input (a config that cannot be read): the command stops with exit code 2
    except Exception as exc:  # noqa: BLE001 - a crashed probe is reported, never shown as a pass
        where = f" in {stage}" if stage else ""
        return stamp(probe, Verdict(Status.ERROR, f"the probe crashed{where}: {type(exc).__name__}: {exc}",
                                    details=traceback.format_exc().strip().splitlines()[-12:]))


def would_skip(probe: Probe, ctx: Context) -> str | None:
    """What `--list` says about a probe: the reason applies() gives for skipping it here, None when
    it would run. A crash in applies() is said, not raised."""
    if probe.applies is None:
        return None
    try:
        return probe.applies(ctx)
    except DoctorError:
        raise
    except Exception as exc:  # noqa: BLE001
        return f"cannot tell: applies() crashed ({type(exc).__name__}: {exc})"


POOL_SIZE = 3  # probes that start no ranks, run side by side (each waits on its own subprocess)


def run_all(probes: list[Probe], ctx: Context,
            on_start: Callable[[Probe], None] | None = None,
            on_done: Callable[[ProbeResult], None] | None = None,
            parallel: bool = True) -> list[ProbeResult]:
    """Every probe, results in the given order. With parallel, probes that start ranks
    (Probe.ranks: torchrun on this machine's GPUs and ports) run one after another in their own
    lane, while the others run beside them in a small pool. The facts every probe reads are
    gathered first, once (by gpu.visible when it comes first); an `early` probe starts at once,
    beside them and beside the probes it needs; any other probe starts once the facts are in and
    the probes it needs (earlier in the list, as the registry orders them) have finished. The
    probes that share the worker reading the facts (Probe.shares) get their sections from it."""
    ctx.plan(probes)
    try:
        return _run_all(probes, ctx, on_start, on_done, parallel)
    finally:
        ctx.close()


def _run_all(probes: list[Probe], ctx: Context, on_start, on_done, parallel: bool) -> list[ProbeResult]:
    if not parallel or len(probes) < 2:
        if parallel and any(p.early for p in probes):  # `--only deepspeed.ops`: the facts arrive meanwhile
            threading.Thread(target=lambda: ctx.facts, daemon=True, name="mgft-facts").start()
        return [_run_one(p, ctx, on_start, on_done) for p in probes]
    _resume()  # a stop of an earlier run_all in this process (the pytest plugin's) is over
    out: dict[str, ProbeResult] = {}
    first, rest = (probes[0], probes[1:]) if not probes[0].ranks and not probes[0].early else (None, probes)
    futures: dict[str, Future] = {}
    submitted = threading.Event()  # every probe has its future: a need can be waited on by id
    lock = threading.Lock()

    def wait_for_needs(probe: Probe) -> None:
        submitted.wait()
        for need in probe.needs:
            if need in futures:
                futures[need].result()  # DoctorError of a needed probe ends the command there

    def locked(callback):
        def call(arg):
            with lock:
                callback(arg)
        return call if callback else None

    def settle(probe: Probe, res: ProbeResult) -> ProbeResult:
        """An early probe ran beside its needs: their verdict decides whether its own counts."""
        wait_for_needs(probe)
        return unmet_need(probe, ctx) or res

    def job(probe: Probe) -> ProbeResult:
        if not probe.early:
            wait_for_needs(probe)
        return _run_one(probe, ctx, locked(on_start), locked(on_done), settle if probe.early else None)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mgft-ranks") as ranks, \
            ThreadPoolExecutor(max_workers=POOL_SIZE, thread_name_prefix="mgft-probe") as pool:
        try:
            for probe in (p for p in rest if p.early):  # a probe that starts ranks keeps to the rank lane
                futures[probe.id] = (ranks if probe.ranks else pool).submit(job, probe)
            if first is not None:  # gpu.visible: it reads the facts (a subprocess) that every other probe asks for
                out[first.id] = _run_one(first, ctx, locked(on_start), locked(on_done))
            else:
                _ = ctx.facts
            for probe in (p for p in rest if not p.early):
                futures[probe.id] = (ranks if probe.ranks else pool).submit(job, probe)
            submitted.set()
            for fut in as_completed(futures.values()):  # the first to raise ends the wait
                res = fut.result()
                out[res.id] = res
        except BaseException:  # Ctrl-C, SIGTERM (the main thread only), bad input: end every run now
            from ..launch.processes import stop_all_runs

            submitted.set()
            for fut in futures.values():
                fut.cancel()
            stop_all_runs()
            raise
    return [out[p.id] for p in probes]


def _resume() -> None:
    from ..launch.processes import resume_runs

    resume_runs()


def _run_one(probe: Probe, ctx: Context, on_start, on_done, settle=None) -> ProbeResult:
    if on_start:
        on_start(probe)
    res = run_probe(probe, ctx)
    if settle is not None:
        res = settle(probe, res)
    ctx.results[probe.id] = res
    if on_done:
        on_done(res)
    return res
