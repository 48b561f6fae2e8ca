"""One log line made comparable: colour codes gone, the rank prefix that launchers add
taken off and remembered, so that ranks interleaved in one log can be told apart."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..text import strip_ansi

# Prefixes that torchrun, accelerate, deepspeed/pdsh and srun put before a rank's output.
_RANK_PREFIX = re.compile(
    r"^(?:(?![\w.]*(?:Error|Exception|Interrupt|Warning)\b)[\w.-]+:\s)?"  # pdsh/deepspeed multi-node: 'host: '
    r"(?:\[(?:rank|default|Rank|RANK)\s?(\d+)\]:?\s?)+"  # [rank1]: [default0]: (possibly repeated)
)
_NUMERIC_PREFIX = re.compile(r"^(\d{1,3}):\s")  # torchrun --tee / srun -l: '3: '
# pdsh / deepspeed multi-node without a rank tag: 'gpu-b: ...', 'node001: ...', '10.0.0.2: ...'
_HOST_PREFIX = re.compile(r"^(?:\d{1,3}(?:\.\d{1,3}){3}|[A-Za-z][\w-]*(?:\d|-)[\w.-]*?)(?<!\.py)(?<!\.cc)(?<!\.cpp)(?<!\.h)(?<!\.so): (?=\S)")
_BOX = "│╭╰┃╮╯─ "  # rich's boxed tracebacks
# an error glued to a progress bar that had no newline: '…155.57 examples/s][E ProcessGroupNCCL.cpp:475] …'
_GLUED = re.compile(r"(?<=\])(?=\[(?:rank\d+\]:|default\d+\]:|[EW]\d{0,4} ))")
_GLOG_RANK = re.compile(r"\[(?:Rank|rank|PG \d+ Rank) (\d+)\]")
MAX_LINE_CHARS = 4000  # matching looks at no more of a line than this


@dataclass(slots=True)
class LogLine:
    """A salient line: where it is (1-based line number), whose it is (rank or None), what it says."""

    no: int
    text: str
    rank: int | None = None
    source: int = 0  # index of the log file when several are explained together


def split_rank(text: str) -> tuple[int | None, str]:
    """Return (rank, text without the launcher's rank prefix)."""
    m = _RANK_PREFIX.match(text)
    if m:
        return int(m.group(1)), text[m.end():]
    m = _NUMERIC_PREFIX.match(text)
    if m:
        return int(m.group(1)), text[m.end():]
    m = _HOST_PREFIX.match(text)
    if m:
        rest = text[m.end():]
        rank, body = split_rank(rest) if rest.startswith("[") else (None, rest)
        return rank, body
    if text.startswith(("[E ", "[W ", "E0", "E1", "W0", "W1", "[E", "[rank")):
        g = _GLOG_RANK.search(text, 0, 200)
        if g:
            return int(g.group(1)), text
    return None, text


def normalise(no: int, raw: str, source: int = 0) -> list[LogLine]:
    """Turn one physical segment into logical lines: ANSI removed, progress redraws split,
    a traceback header glued to a progress bar split off, rank prefix recognised."""
    text = strip_ansi(raw)
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS]
    pieces = [p for p in text.split("\r")] if "\r" in text else [text]
    if "][" in text:
        pieces = [part for p in pieces for part in _GLUED.split(p)]
    out: list[LogLine] = []
    for piece in pieces:
        piece = piece.rstrip()
        if not piece.strip():
            continue
        if piece.startswith("^C"):
            piece = piece[2:]
            out.append(LogLine(no, "^C", None, source))
        rank, body = split_rank(piece)
        if body[:1] in "│╭╰┃":
            body = body.strip(_BOX)
            if not body:
                continue
        idx = body.find("Traceback (most recent call last)")
        if idx > 0:
            head = body[:idx].rstrip()
            if head.strip():
                out.append(LogLine(no, head, rank, source))
            body = body[idx:]
        out.append(LogLine(no, body, rank, source))
    return out
