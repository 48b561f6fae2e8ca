"""`pytest --mgft-doctor`: the doctor's probes as test items.

One collector `mgft-doctor` under the session holds one item per registered probe
(`mgft-doctor::gpu.visible`, ...), placed before the user's tests so an environment failure
is the first thing the run reports. `-k`, `-m mgft_doctor`, `--deselect` and `-x` work as on
any item; `--mgft-doctor-only` / `--mgft-doctor-skip` take probe ids or families as the CLI's
`--only` / `--skip` do.

Outcomes: pass -> passed; warn -> passed with an MgftDoctorWarning in the warnings summary
(failed under --mgft-doctor-strict); skip -> skipped with the probe's reason; fail / error ->
failed, the report showing the findings (code, message, fix) instead of a traceback. Every
item records user_properties (probe, status, summary, codes, scalar metrics) that
`--junitxml` writes as <property> elements; the probe's details are a report section."""

from __future__ import annotations

import sys
import warnings

import pytest

from ..check.probe import Probe, ProbeResult, Status, finding_lines, finding_text
from ..text import split_csv as _split
from .state import ITEM_MARKER, DoctorState, MgftDoctorWarning

COLLECTOR_NAME = "mgft-doctor"
SECTION = "mgft-doctor probe"


class ProbeFailed(Exception):
    """Raised by a probe item whose probe failed, crashed, or warned under --mgft-doctor-strict."""

    def __init__(self, result: ProbeResult):
        super().__init__(f"{result.id}: {result.status.value}: {result.summary}")
        self.result = result


class _Crash:
    """What pytest's short summary (`-rf`) and JUnit's failure message read: reprcrash.message."""

    def __init__(self, path: str, lineno: int, message: str):
        self.path, self.lineno, self.message = path, lineno, message


class _Lines:
    def __init__(self):
        self.out: list[str] = []

    def line(self, s: str = "", **markup) -> None:
        self.out.append(s)


class ProbeFailureRepr:
    """The failure report of a probe item: the doctor's findings, not a Python traceback."""

    def __init__(self, res: ProbeResult, path: str, lineno: int, verbose: bool):
        self.res = res
        self.verbose = verbose
        first = _first_finding(res)
        message = f"{first.code} {first.message}" if first else f"{res.status.value}: {res.summary}"
        self.reprcrash = _Crash(path, lineno, message)

    def toterminal(self, tw) -> None:
        res = self.res
        word = {Status.FAIL: "failed", Status.ERROR: "crashed (a bug in the probe or its environment)",
                Status.WARN: "warned (--mgft-doctor-strict makes warnings fail)"}.get(res.status, res.status.value)
        tw.line(f"[{res.status.mark}] {res.title} ({res.id}) {word}", red=True, bold=True)
        tw.line(f"    {res.summary}")
        for f in res.findings:
            head, fix = finding_lines(f)
            tw.line(head, red=f.severity is Status.FAIL, yellow=f.severity is Status.WARN)
            tw.line(fix)
        if res.status is Status.ERROR or self.verbose:
            for d in res.details:
                tw.line(f"      {d}")
        codes = list(dict.fromkeys(f.code for f in res.findings))
        if codes:
            tw.line(f"    each code explained: mgft-doctor codes {codes[0]}"
                    + (f" (and {', '.join(codes[1:])})" if codes[1:] else ""))

    def __str__(self) -> str:
        lines = _Lines()
        self.toterminal(lines)
        return "\n".join(lines.out)


def _first_finding(res: ProbeResult):
    for sev in (Status.FAIL, Status.WARN):
        for f in res.findings:
            if f.severity is sev:
                return f
    return res.findings[0] if res.findings else None


def _probe_location(probe: Probe) -> tuple[str, int]:
    """The probe module's file and the line of its run() (where -vv, warnings and crashes point)."""
    module = sys.modules.get(probe.run.__module__)
    path = getattr(module, "__file__", None) or "<mgft-doctor>"
    code = getattr(probe.run, "__code__", None)
    return path, (code.co_firstlineno if code else 1)


def properties(res: ProbeResult) -> list[tuple[str, object]]:
    props: list[tuple[str, object]] = [("mgft_doctor_probe", res.id), ("mgft_doctor_status", res.status.value),
                                       ("mgft_doctor_summary", res.summary)]
    props += [("mgft_doctor_code", c) for c in dict.fromkeys(f.code for f in res.findings)]
    for k, v in res.metrics.items():
        if isinstance(v, (int, float, str, bool)):
            props.append((f"mgft_doctor_metric_{k}", v))
    props.append(("mgft_doctor_duration_s", round(res.duration_s, 3)))
    return props


def section_text(res: ProbeResult, findings: bool = True) -> str:
    """What the probe ran and saw (the CLI's -v); the findings unless the failure shows them."""
    lines = [f"{res.status.mark} {res.id}: {res.summary} ({res.duration_s:.1f} s)"]
    if findings:
        lines += [line for f in res.findings for line in finding_lines(f, "  ")]
    lines += [f"  {d}" for d in res.details]
    lines += [f"  {k} = {v}" for k, v in res.metrics.items() if not isinstance(v, (list, dict))]
    return "\n".join(lines)


class ProbeItem(pytest.Item):
    """One probe as a test item; runs through the doctor's runner with the session's Context."""

    _mgft_doctor_probe = True  # the explain plugin leaves these to their own findings

    def __init__(self, *, probe: Probe, doctor: DoctorState, **kw):
        super().__init__(**kw)
        self.probe = probe
        self.doctor = doctor
        self.result: ProbeResult | None = None
        self.add_marker(ITEM_MARKER)
        self.extra_keyword_matches.add(probe.family)
        if probe.slow:
            self.extra_keyword_matches.add("slow")

    def runtest(self) -> None:
        from ..errors import DoctorError

        ctx = self.doctor.context()
        try:
            (res,) = self.doctor.run_probes(ctx, [self.probe])
        except DoctorError as exc:  # bad input the probe found (a config it cannot read)
            res = ProbeResult(self.probe.id, self.probe.title, Status.FAIL, f"bad input: {exc}")
        self.result = res
        self.user_properties.extend(properties(res))
        if res.status is Status.SKIP:
            reason = res.summary.removeprefix("skipped: ")
            for f in res.findings:
                reason += f"; {finding_text(f)}"
            pytest.skip(reason)
        if res.status in (Status.FAIL, Status.ERROR) or (res.status is Status.WARN and self.doctor.strict):
            raise ProbeFailed(res)
        if res.status is Status.WARN:
            path, lineno = _probe_location(self.probe)
            shown = res.findings or [None]
            for f in shown:
                text = f"{res.id}: {res.summary}" if f is None else f"{res.id}: {finding_text(f)}"
                warnings.warn_explicit(MgftDoctorWarning(text), MgftDoctorWarning, path, lineno,
                                       module=self.probe.run.__module__)

    def repr_failure(self, excinfo, style=None):
        res = self.result
        if res is not None and isinstance(excinfo.value, (ProbeFailed, MgftDoctorWarning)):
            if isinstance(excinfo.value, MgftDoctorWarning):  # -W error::...MgftDoctorWarning
                res = ProbeResult(res.id, res.title, Status.WARN, res.summary, res.findings, res.metrics,
                                  res.details, res.duration_s)
            path, lineno = _probe_location(self.probe)
            return ProbeFailureRepr(res, path, lineno, self.config.get_verbosity() >= 2)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        path, lineno = _probe_location(self.probe)
        # the domain heads the failure section; it must not end the nodeid, or `-v` would print
        # 'mgft-doctor::nccl::allreduce' (pytest turns the dots of a domain that does into '::')
        return path, lineno - 1, f"{self.probe.id}: {self.probe.title}"


class ProbeCollector(pytest.Collector):
    """The session-level collector `mgft-doctor` of the selected probes."""

    def __init__(self, *, doctor: DoctorState, select, **kw):
        super().__init__(**kw)
        self.doctor = doctor
        self.select = select

    def collect(self):
        # a probe module that cannot be imported is this collector's error, reported as pytest
        # reports a test module that cannot be imported
        for probe in self.select():
            yield ProbeItem.from_parent(self, name=probe.id, probe=probe, doctor=self.doctor)

    def reportinfo(self):
        return self.path, None, COLLECTOR_NAME


class ProbesPlugin:
    """Registered by pytest_configure under --mgft-doctor."""

    def __init__(self, doctor: DoctorState):
        self.doctor = doctor

    def selected(self) -> list[Probe]:
        from ..check.registry import all_probes
        from ..check.registry import select

        c = self.doctor.config
        return select(all_probes(), _split(c.getoption("mgft_doctor_only")) or None,
                      _split(c.getoption("mgft_doctor_skip")) or None)

    def validate(self) -> None:
        """Bad options are usage errors before anything runs (as `mgft-doctor check` exits 2)."""
        from ..errors import DoctorError

        options = self.doctor.options()
        try:
            if options.config or options.deepspeed:
                _ = self.doctor.context().run_config  # a broken YAML/JSON is bad input
            self.selected()
        except DoctorError as exc:
            raise pytest.UsageError(f"mgft-doctor: {exc}")
        except Exception:  # noqa: BLE001 - a probe module that does not import: collection reports it
            pass
        import os

        if not os.path.isfile(options.python):
            raise pytest.UsageError(f"mgft-doctor: --mgft-doctor-python {options.python}: no such interpreter")

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        o = self.doctor.options()
        try:
            count = str(len(self.selected()))
        except Exception:  # noqa: BLE001 - reported by the collection
            count = "?"
        parts = [f"{count} probe(s) as items 'mgft-doctor::<id>'",
                 f"nproc {o.nproc or 'auto'}", f"timeout {o.timeout:g} s"]
        if o.python != sys.executable:
            parts.append(f"python {o.python}")
        if o.config:
            parts.append(f"config {o.config}")
        if self.doctor.strict:
            parts.append("strict")
        from .. import __version__

        return [f"mgft-doctor {__version__}: " + ", ".join(parts)]

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        # first, so that -k / -m / --deselect (which run after) select among the probes too
        collector = ProbeCollector.from_parent(session, name=COLLECTOR_NAME, nodeid=COLLECTOR_NAME,
                                               doctor=self.doctor, select=self.selected)
        items[:0] = list(session.genitems(collector))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if isinstance(item, ProbeItem) and call.when == "call" and item.result is not None:
            res = item.result
            report.sections.append((SECTION, section_text(res, findings=not report.failed)))
            if report.skipped and isinstance(report.longrepr, tuple):
                # `SKIPPED [1] mgft-doctor::nccl.p2p: needs 2 GPUs, 0 visible`, not the plugin's line
                report.longrepr = (item.nodeid, None, report.longrepr[2])
        return report
