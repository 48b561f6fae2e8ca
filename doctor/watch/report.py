"""The stall report: what triggered it, one line per rank (the collective it waits in, or its
top frame), the finding with the catalog's fix, where the dumps are. Plain text on stderr, the
same as JSON in the run folder (stall.json) for tools and tests."""

from __future__ import annotations

import json
from pathlib import Path

from .analysis import Finding, RankState


def rank_line(s: RankState) -> str:
    who = f"rank {s.rank}" if s.rank is not None else "process"
    head = f"  {who} (pid {s.proc.pid})"
    if not s.alive:
        return f"{head}: gone (exited before the stall was seen)"
    if s.waiting is not None:
        text = f"{head}: waits in {s.waiting.describe() if s.waiting.seq >= 0 else s.waiting.name}"
        if s.called_from is not None:
            text += f", called from {s.called_from.short()}"
        return text
    text = f"{head}: in {s.where()}"
    if s.trace is not None and s.trace.enqueued:
        last = max(s.trace.enqueued.get("0", -1), -1)
        if last >= 0:
            text += f" (last collective #{last})"
    if s.kernel_state == "D":
        text += " [uninterruptible I/O]"
    return text


def render_stall(reason: str, states: list[RankState], finding: Finding, folder: Path,
                 stopping: bool) -> str:
    lines = [f"mgft-doctor: {reason}: the run is stalled. Where each rank is:"]
    lines += [rank_line(s) for s in states] or ["  (no process of the run could be asked)"]
    summary = finding.summary[:1].upper() + finding.summary[1:]
    lines.append(summary)
    if finding.code:
        lines.append(f"Most likely: {finding.code} {finding.title}")
        if finding.fix:
            lines.append(f"  Fix: {finding.fix}")
        lines.append(f"  More: mgft-doctor codes {finding.code}")
    if finding.hint:
        lines.append(finding.hint)
    lines.append(f"Stacks: {folder / 'stacks'}  Flight Recorder: {folder / 'fr'}")
    if stopping:
        lines.append("mgft-doctor: stopping the run (SIGTERM, then SIGKILL); --keep-running leaves it running.")
    else:
        lines.append("mgft-doctor: --keep-running: the run goes on.")
    return "\n".join(lines) + "\n"


def stall_json(reason: str, states: list[RankState], finding: Finding, silent_s: float, dump_s: float) -> dict:
    return {
        "schema": "mgft-doctor/stall/1",
        "reason": reason,
        "silent_s": round(silent_s, 2),  # from the run's last output to the report
        "dump_s": round(dump_s, 2),  # asking the ranks and reading their answers
        "pattern": finding.pattern,
        "code": finding.code,
        "fix": finding.fix,
        "summary": finding.summary,
        "outliers": finding.outliers,
        "collective": None if finding.target is None else {
            "pg": finding.target.pg, "seq": finding.target.seq, "op": finding.target.name},
        "ranks": [{
            "rank": s.rank, "pid": s.proc.pid, "alive": s.alive, "answered": s.answered,
            "waiting": None if s.waiting is None else {"pg": s.waiting.pg, "seq": s.waiting.seq, "op": s.waiting.name},
            "top_frame": None if s.top is None else {"func": s.top.func, "file": s.top.file, "line": s.top.line},
            "user_frame": None if s.users is None else {"func": s.users.func, "file": s.users.file, "line": s.users.line},
            "called_from": None if s.called_from is None else s.called_from.short(),
        } for s in states],
    }


def write_stall_json(folder: Path, data: dict) -> None:
    (folder / "stall.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
