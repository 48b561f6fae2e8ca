"""`@pytest.mark.mgft_gpus(N, probes=[...])`: skip a test unless N GPUs are visible to torch and
the probes pass; the probes run once per session and their verdict is cached in the state."""

from __future__ import annotations

from ..text import one_line as _short
from ..text import split_csv
from .state import MARKER, DoctorState


class MarkerError(Exception):
    """The marker was written wrongly: the test fails with this message."""


def requirement(doctor: DoctorState, gpus: int, selectors: tuple[str, ...] | None) -> str | None:
    """None when `gpus` GPUs are visible and the probes pass; else the skip reason."""
    key = (gpus, selectors)
    if key not in doctor.requirements:
        doctor.requirements[key] = _check_requirement(doctor, gpus, selectors)
    return doctor.requirements[key]


def _check_requirement(self: DoctorState, gpus: int, selectors: tuple[str, ...] | None) -> str | None:
    from ..check.probe import Status
    from ..check.registry import all_probes, with_needs

    registry = all_probes()
    if selectors is None:
        selectors = ("nccl.allreduce",) if gpus >= 2 else ("gpu.visible",) if gpus == 1 else ()
    chosen = with_needs(registry, _select(registry, selectors))
    head = f"{MARKER}({gpus})"
    ctx = self.context(gpus if gpus >= 2 else None)
    if gpus:
        facts = ctx.facts  # torch's view, read once per session (a subprocess of the Python examined)
        why = facts.raw.get("facts_error") or facts.raw.get("torch_error")
        if why:
            return f"{head}: needs {gpus} GPU(s); torch cannot tell in {ctx.options.python}: {_short(why)}"
        if facts.gpu_count < gpus:
            cvd = facts.raw.get("cuda_visible_devices")
            return (f"{head}: needs {gpus} GPU(s), {facts.gpu_count} visible to torch"
                    + (f" (CUDA_VISIBLE_DEVICES={cvd!r})" if cvd is not None else ""))
    verbs = {Status.FAIL: "failed", Status.ERROR: "crashed", Status.SKIP: "was skipped"}
    for res in self.run_probes(ctx, chosen):
        if res.status in verbs:
            what = res.summary.removeprefix("skipped: ")
            if res.findings:
                f = next((f for f in res.findings if f.severity is Status.FAIL), res.findings[0])
                what = f"{f.code} {f.message}"
            return f"{head}: probe {res.id} {verbs[res.status]}: {_short(what)}"
    return None


def _select(registry, selectors) -> list:
    from ..errors import DoctorError
    from ..check.registry import select

    try:
        return select(registry, list(selectors) or None, None) if selectors else []
    except DoctorError as exc:
        raise MarkerError(str(exc))


def marker_args(marker) -> tuple[int, tuple[str, ...] | None]:
    args, kwargs = list(marker.args), dict(marker.kwargs)
    if "gpus" in kwargs:
        args.insert(0, kwargs.pop("gpus"))
    probes = kwargs.pop("probes", None)
    if kwargs:
        raise MarkerError(f"unexpected argument(s) {', '.join(sorted(kwargs))}; use {MARKER}(n, probes=[...])")
    if len(args) != 1 or isinstance(args[0], bool) or not isinstance(args[0], int) or args[0] < 0:
        raise MarkerError(f"takes one GPU count (an integer >= 0), e.g. @pytest.mark.{MARKER}(2); got {marker.args!r}")
    if probes is None:
        return args[0], None
    if isinstance(probes, str):
        probes = [probes]
    return args[0], tuple(split_csv(probes))
