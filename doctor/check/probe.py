"""What a probe is and what it returns. A probe has a stable id `family.name`, a title, the
probes whose results it needs, a cheap applies(context) -> skip reason | None that the runner
asks first (as DeepSpeed's is_compatible() comes before load()), and run(context) -> Verdict
(summary, findings, metrics, details), on which the runner stamps the probe's id, title and
duration. A probe that raises is shown as crashed (`error`), never as a pass."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"  # the probe itself crashed

    @property
    def mark(self) -> str:
        return {"pass": "✓", "warn": "!", "fail": "✗", "skip": "-", "error": "E"}[self.value]


@dataclass
class Finding:
    """One thing a probe found: a catalog code, what is wrong, and what to do."""

    code: str
    message: str
    fix: str
    severity: Status = Status.FAIL  # FAIL or WARN: how much this finding weighs on the probe

    def to_json(self) -> dict:
        return {"code": self.code, "message": self.message, "fix": self.fix, "severity": self.severity.value}


def finding_lines(f: Finding, indent: str = "    ") -> list[str]:
    """A finding as every report prints it (check's rows, the pytest plugin's failure report and
    its section): the mark, the code and what is wrong; under it, what to do."""
    return [f"{indent}{f.severity.mark} {f.code} {f.message}", f"{indent}  fix: {f.fix}"]


def finding_text(f: Finding) -> str:
    """A finding on one line, where only one fits (a pytest skip reason or warning)."""
    return f"{f.code} {f.message} (fix: {f.fix})"


@dataclass
class ProbeResult:
    id: str
    title: str
    status: Status
    summary: str
    findings: list[Finding] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)  # shown with -v: what was run, what was seen
    duration_s: float = 0.0

    def to_json(self) -> dict:
        return {"id": self.id, "status": self.status.value, "title": self.title, "summary": self.summary,
                "findings": [f.to_json() for f in self.findings], "metrics": self.metrics,
                "details": self.details, "duration_s": round(self.duration_s, 3)}


def status_of(findings: list[Finding]) -> Status:
    """Any FAIL finding fails a probe, any WARN finding warns it, none passes it."""
    if any(f.severity is Status.FAIL for f in findings):
        return Status.FAIL
    return Status.WARN if findings else Status.PASS


@dataclass
class Verdict:
    """What a probe's run() decides. The runner stamps the probe's id, title and duration on it
    (flutter's validate() wrapping validateImpl()) and makes it a ProbeResult."""

    status: Status
    summary: str
    findings: list[Finding] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    skipped: bool = False  # made by skip(): the summary is the reason, the runner says "skipped"


def verdict(summary: str, findings: list[Finding] | None = None, metrics: dict | None = None,
            details: list[str] | None = None, status: Status | None = None) -> Verdict:
    """A verdict whose status follows from its findings (status_of) unless given."""
    findings = findings or []
    return Verdict(status_of(findings) if status is None else status, summary, findings, metrics or {}, details or [])


def skip(reason: str, findings: list[Finding] | None = None, metrics: dict | None = None,
         details: list[str] | None = None) -> Verdict:
    """The probe could not test what it is for, and why; findings made on the way still count
    (then they decide the status)."""
    findings = findings or []
    return Verdict(status_of(findings) if findings else Status.SKIP, reason, findings, metrics or {}, details or [],
                   skipped=True)


# Whole results with the identity written by the probe: what probes returned before the runner
# stamped it. Still accepted from run() (the runner re-stamps id and title).

def result(probe_id: str, title: str, summary: str, findings: list[Finding] | None = None,
           metrics: dict | None = None, details: list[str] | None = None,
           status: Status | None = None) -> ProbeResult:
    v = verdict(summary, findings, metrics, details, status)
    return ProbeResult(probe_id, title, v.status, v.summary, v.findings, v.metrics, v.details)


def skipped(probe_id: str, title: str, reason: str) -> ProbeResult:
    return ProbeResult(probe_id, title, Status.SKIP, reason)


@dataclass(frozen=True)
class Probe:
    id: str
    title: str
    run: Callable[["Context"], Verdict]  # noqa: F821 - doctor.context.Context
    needs: tuple[str, ...] = ()
    slow: bool = False  # starts processes or builds code (seconds to minutes)
    # Why the probe does not apply here (no run config, no model, too few GPUs), or None. Cheap:
    # it may read the run config and the cached facts, never start a run; --list shows it.
    applies: Callable[["Context"], str | None] | None = None  # noqa: F821
    # Starts ranks (torchrun) on this machine's GPUs and ports: the runner runs these one at a
    # time, beside the probes that start none.
    ranks: bool = False
    # Starts at once: beside the facts being read and beside the probes it needs (its own
    # subprocesses depend on neither; its applies() must not read the facts); if a need fails,
    # its result is replaced by the usual "needs ..." skip.
    early: bool = False
    # The part of this probe that the shared worker (check/shared.py, probes/workers/stack.py)
    # does, in the interpreter that reads the facts: (its arguments, the limits of its sections),
    # asked when a check that plans this probe starts that worker; it must not read the facts.
    # The probe takes its sections with Context.shared_section and runs its own worker for any
    # that did not come.
    shares: Callable[["Context"], tuple[dict, list]] | None = None  # noqa: F821
    # What a long run of this probe is waiting for, shown beside its seconds on a terminal
    # ("a first JIT build takes about a minute, then it is cached").
    hint: str = ""

    @property
    def family(self) -> str:
        return self.id.split(".", 1)[0]
