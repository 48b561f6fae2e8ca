"""The "mgft-doctor diagnosis" of a failing test (active with --mgft-doctor,
--mgft-doctor-explain or ini mgft_doctor_explain = true).

When a test fails in any phase, its captured output (stdout, stderr, log, in the order pytest
captured them) and its exception, formatted as Python prints it, go through the same
`explain` that reads training logs. If a catalog entry matches, the report gets a section
"mgft-doctor diagnosis" (code, title, evidence, what happened, fixes) and the user_properties
`mgft_doctor_code` / `mgft_doctor_title` (JUnit XML <property> elements); the terminal
summary lists every diagnosed failure. A failure nothing in the catalog knows gets nothing:
no section, no noise."""

from __future__ import annotations

import textwrap
import traceback

import pytest

from ..text import mask_data

SECTION = "mgft-doctor diagnosis"
MAX_TEXT = 4_000_000  # characters of captured output read per failure (the tail: where errors are)


def failure_text(report, excinfo) -> str:
    parts = [content for name, content in report.sections if name.startswith("Captured ")]
    if excinfo is not None:
        try:
            parts.append("".join(traceback.format_exception(excinfo.type, excinfo.value, excinfo.tb)))
        except Exception:  # noqa: BLE001 - an exception that cannot be formatted: use pytest's text
            parts.append(report.longreprtext)
    else:
        parts.append(report.longreprtext)
    text = "\n".join(parts)
    return text[-MAX_TEXT:]


def diagnose(text: str):
    """explain's report for this text, or None when no catalog entry matched."""
    from ..explain import explain_text

    report = explain_text(text)
    if not report.diagnoses:
        return None
    # the installed versions pick version-aware fixes; read them only when there is something to fix
    return explain_text(text, use_installed=True)


def section_text(report) -> str:
    report = mask_data(report)  # no secret of the captured output reaches the test report
    d = report.diagnoses[0]
    wrap = textwrap.TextWrapper(width=100, initial_indent="  ", subsequent_indent="  ")
    lines = [f"{d.code}  {d.title}",
             f"confidence {d.confidence:.2f}" + (f", rank {d.rank}" if d.rank is not None else "")]
    if d.evidence:
        lines.append("evidence:")
        lines += [f"  {e.text.strip()[:300]}" for e in d.evidence[:4]]
    lines.append("what happened:")
    lines += wrap.wrap(" ".join(d.explanation.split()))
    if d.fixes:
        lines.append("fixes, in order of preference:")
        lines += [f"  {i}. {fix}" for i, fix in enumerate(d.fixes, 1)]
    others = report.diagnoses[1:3]
    if others:
        lines.append("also possible: " + "; ".join(f"{o.code} {o.title} ({o.confidence:.2f})" for o in others))
    lines.append(f"more: mgft-doctor codes {d.code}")
    return "\n".join(lines)


class ExplainPlugin:
    def __init__(self):
        self.diagnosed: list[tuple[str, str, str]] = []  # (nodeid, code, title), from the reports

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if report.failed and not getattr(item, "_mgft_doctor_probe", False):
            try:
                found = diagnose(failure_text(report, call.excinfo))
            except Exception as exc:  # noqa: BLE001 - never let the doctor break a test report
                report.sections.append((SECTION, f"mgft-doctor could not read this failure: {type(exc).__name__}: {exc}"))
            else:
                if found is not None:
                    d = found.diagnoses[0]
                    report.sections.append((SECTION, section_text(found)))
                    found_props = [("mgft_doctor_code", d.code), ("mgft_doctor_title", d.title)]
                    report.user_properties.extend(found_props)
                    # JUnit XML writes the properties of the teardown report, which copies the item's
                    item.user_properties.extend(found_props)
        return report

    def pytest_runtest_logreport(self, report) -> None:
        # on the controller too under xdist: read what the worker recorded
        if not report.failed:
            return
        props = dict(report.user_properties)
        if "mgft_doctor_title" in props:
            self.diagnosed.append((report.nodeid, str(props["mgft_doctor_code"]), str(props["mgft_doctor_title"])))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.diagnosed:
            return
        tr = terminalreporter
        tr.write_sep("=", "mgft-doctor diagnoses", yellow=True)
        for nodeid, code, title in self.diagnosed:
            tr.write_line(f"{code} {nodeid} - {title}")
        codes = sorted({code for _, code, _ in self.diagnosed})
        tr.write_line(f"`mgft-doctor codes {codes[0]}` explains a code; the failure's section "
                      f"'{SECTION}' lists the fixes")
