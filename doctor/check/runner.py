"""Run probes in order, honour what each needs, and turn a crashing probe into an `error` result
instead of a traceback."""

from __future__ import annotations

import time
import traceback
from typing import Callable

from .context import Context
from ..errors import DoctorError
from .probe import Probe, ProbeResult, Status


def run_probe(probe: Probe, ctx: Context) -> ProbeResult:
    for need in probe.needs:
        done = ctx.results.get(need)
        if done is not None and done.status in (Status.FAIL, Status.ERROR):
            return ProbeResult(probe.id, probe.title, Status.SKIP, f"skipped: needs {need}, which did not pass")
    t0 = time.perf_counter()
    try:
        res = probe.run(ctx)
    except DoctorError:
        raise
    except Exception as exc:  # noqa: BLE001 - a crashed probe is reported, never shown as a pass
        res = ProbeResult(probe.id, probe.title, Status.ERROR, f"the probe crashed: {type(exc).__name__}: {exc}",
                          details=traceback.format_exc().strip().splitlines()[-12:])
    res.duration_s = time.perf_counter() - t0
    return res


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
