"""One rendering of a finding (check/probe.py finding_lines) in both reports that print one: the
CLI's rows (check/report.py render_results) and the pytest plugin's failure report and section
(pytest_plugin/probes.py). The same finding reads the same in each."""

from __future__ import annotations

import io

from rich.console import Console

from mgft_doctor.check.probe import Finding, ProbeResult, Status, finding_lines, finding_text
from mgft_doctor.check.report import render_results
from mgft_doctor.pytest_plugin.probes import ProbeFailureRepr, section_text

FINDINGS = [Finding("MGD301", "no answer within 20 s from rank 1 (at 'init_process_group')", "export NCCL_P2P_DISABLE=1"),
            Finding("MGD201", "/dev/shm is 512 MiB [not markup]", "docker run --shm-size=16g", Status.WARN)]
RESULT = ProbeResult("nccl.allreduce", "All-reduce", Status.FAIL, "2 ranks", FINDINGS, duration_s=1.5)


def cli_text(results) -> str:
    out = io.StringIO()
    render_results(results, Console(file=out, width=400, highlight=False, color_system=None))
    return out.getvalue()


def test_the_finding_lines():
    assert finding_lines(FINDINGS[0]) == [
        "    ✗ MGD301 no answer within 20 s from rank 1 (at 'init_process_group')",
        "      fix: export NCCL_P2P_DISABLE=1"]
    assert finding_text(FINDINGS[1]) == "MGD201 /dev/shm is 512 MiB [not markup] (fix: docker run --shm-size=16g)"


def test_cli_and_pytest_plugin_print_the_same_lines():
    cli = cli_text([RESULT]).splitlines()
    plugin = str(ProbeFailureRepr(RESULT, "probe.py", 1, verbose=False)).splitlines()
    for f in FINDINGS:
        lines = finding_lines(f)
        for shown in (cli, plugin):
            at = shown.index(lines[0])  # rich markup in a message is printed as written
            assert shown[at + 1] == lines[1]
    section = section_text(RESULT).splitlines()
    assert section[1:5] == [line for f in FINDINGS for line in finding_lines(f, "  ")]


def test_cli_colours_the_mark_and_the_code_only():
    out = io.StringIO()
    render_results([RESULT], Console(file=out, width=400, highlight=False, force_terminal=True, color_system="standard"))
    text = out.getvalue()
    assert "\x1b[31m✗\x1b[0m \x1b[36mMGD301\x1b[0m no answer" in text
