"""Turn a failed multi-rank launch into findings: a time-out names the silent ranks and where
each stopped; a crash is explained by running `explain` over the launch's own log, so a probe
reports the same codes a user's training log would get."""

from __future__ import annotations

from .launcher import LaunchResult
from .probe import Finding


def _explain_log(text: str):
    from .explain import explain_text

    return explain_text(text)


def launch_failure_findings(res: LaunchResult, what: str, hang_code: str, died_code: str,
                            hang_fix: str) -> tuple[list[Finding], list[str]]:
    """Findings and detail lines for a launch that did not succeed."""
    details = [f"command: {' '.join(res.command[:9])} …", f"wall time {res.wall_s:.1f} s, exit code {res.returncode}"]
    findings: list[Finding] = []
    if res.timed_out:
        answered = [r for r, o in res.ranks.items() if o.answered]
        findings.append(Finding(
            hang_code,
            f"{what} did not finish within the time limit ({res.wall_s:.0f} s): no answer from "
            f"{res.describe_silence()}" + (f"; ranks {answered} finished" if answered else ""),
            hang_fix))
    report = _explain_log(res.log) if res.log.strip() else None
    if report is not None and report.diagnoses and not res.timed_out:
        d = report.diagnoses[0]
        root = report.root_error.text.strip() if report.root_error else ""
        findings.append(Finding(d.code, f"{what} failed: {d.title}" + (f" ({root[:200]})" if root else ""), d.fixes[0]))
    elif not res.timed_out:
        failed = res.failed_ranks
        errors = [f"rank {o.rank}: {o.result.get('error_type')}: {o.result.get('error', '')[:300]}"
                  for o in res.ranks.values() if o.result and not o.result.get("ok", True)]
        if errors:
            msg = "; ".join(errors)
        elif res.silent_ranks:
            msg = f"{res.describe_silence()} exited without a result (exit code {res.returncode})"
        else:
            msg = f"torchrun exited with code {res.returncode}"
        root = report.root_error.text.strip()[:200] if report is not None and report.root_error else ""
        findings.append(Finding(died_code, f"{what} failed: {msg}" + (f" — {root}" if root and root not in msg else ""),
                                "Read the rank's error above; `mgft-doctor -v` shows the launch log."))
        _ = failed
    tail = [ln for ln in res.log.strip().splitlines()[-25:]]
    details += ["launch log (tail):", *("  " + ln[:300] for ln in tail)]
    return findings, details
