"""Run probes in order, honour what each needs, ask each whether it applies before running it,
stamp the probe's id, title and duration on what run() decides (and "skipped: " on a skip), and
turn a crashing probe (in applies() or run()) into an `error` result instead of a traceback."""

from __future__ import annotations

import time
import traceback
from typing import Callable

from .context import Context
from ..errors import DoctorError
from .probe import Probe, ProbeResult, Status, Verdict

SKIP_PREFIX = "skipped: "  # every skip summary starts so (the rows and the JSON show it)


def run_probe(probe: Probe, ctx: Context) -> ProbeResult:
    for need in probe.needs:
        done = ctx.results.get(need)
        if done is not None and done.status in (Status.FAIL, Status.ERROR):
            return stamp(probe, Verdict(Status.SKIP, f"needs {need}, which did not pass", skipped=True))
    t0 = time.perf_counter()
    res = _applies_then_run(probe, ctx)
    res.duration_s = time.perf_counter() - t0
    return res


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


def run_all(probes: list[Probe], ctx: Context,
            on_start: Callable[[Probe], None] | None = None,
            on_done: Callable[[ProbeResult], None] | None = None) -> list[ProbeResult]:
    out = []
    for probe in probes:
        if on_start:
            on_start(probe)
        res = run_probe(probe, ctx)
        ctx.results[probe.id] = res
        out.append(res)
        if on_done:
            on_done(res)
    return out
