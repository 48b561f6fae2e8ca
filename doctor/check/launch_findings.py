"""Turn a failed multi-rank launch into findings: a time-out names the silent ranks and where
each stopped; a crash is explained by running `explain` over the launch's own log, so a probe
reports the same codes a user's training log would get."""

from __future__ import annotations

from ..launch.torchrun import LaunchResult
from .probe import Finding


def explain_log(text: str):
    from ..explain import explain_text

    return explain_text(text)


def _signal_name(code: int) -> str:
    from ..explain.failures import SIGNALS

    return SIGNALS.get(-code, f"signal {-code}")


def launch_failure_findings(res: LaunchResult, what: str, hang_code: str, died_code: str,
                            hang_fix: str) -> tuple[list[Finding], list[str]]:
    """Findings and detail lines for a launch that did not succeed."""
    details = [f"command: {' '.join(res.command[:9])} …", f"wall time {res.wall_s:.1f} s, exit code {res.returncode}"]
    findings: list[Finding] = []
    if res.timed_out:
        answered = [r for r, o in res.ranks.items() if o.answered]
        findings.append(Finding(
            hang_code,
            f"{what} hung: no answer within {res.wall_s:.0f} s from {res.describe_silence()}"
            + (f"; ranks {answered} finished" if answered else ""),
            hang_fix))
    report = explain_log(res.log) if res.log.strip() else None
    if report is not None and report.diagnoses and not res.timed_out:
        d = report.diagnoses[0]
        root = report.root_error.text.strip() if report.root_error else ""
        findings.append(Finding(d.code, f"{what} failed: {d.title}" + (f" ({root[:200]})" if root else ""), d.fixes[0]))
    elif not res.timed_out:
        errors = [f"rank {o.rank}: {o.result.get('error_type')}: {o.result.get('error', '')[:300]}"
                  for o in res.ranks.values() if o.result and not o.result.get("ok", True)]
        dead = report.failed_rank if report is not None else None
        codes = [c for c in (report.exit_codes if report is not None else []) if c]
        if errors:
            msg = "; ".join(errors)
        elif dead is not None and codes:
            msg = f"rank {dead} died with exit code {codes[0]}" + (
                f" ({_signal_name(codes[0])})" if codes[0] < 0 else "") + " before reporting; the others were stopped"
        elif res.silent_ranks:
            msg = f"{res.describe_silence()} exited without a result (exit code {res.returncode})"
        else:
            msg = f"torchrun exited with code {res.returncode}"
        findings.append(Finding(died_code, f"{what} failed: {msg}",
                                "Read the rank's error above; `mgft-doctor -v` shows the launch log."))
    tail = [ln for ln in res.log.strip().splitlines()[-25:]]
    details += ["launch log (tail):", *("  " + ln[:300] for ln in tail)]
    return findings, details
