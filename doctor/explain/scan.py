"""Find the few lines of a log worth reading, without touching the rest in Python.

A log of a long run is almost all progress bars and loss dicts. One compiled alternation of
trigger words runs over each byte block in C; only the lines it hits (plus the message lines
that follow an exception) are decoded and normalised. The catalog adds its own trigger words,
so a line that a catalog pattern needs is never skipped: the catalog examples test that."""

from __future__ import annotations

import re
from typing import Iterable, Iterator

from .lines import LogLine, normalise
from .source import LogSource, iter_blocks

# Words that make a line salient, in the casings that logs really use. Case-sensitive on
# purpose: a case-insensitive alternation is ~20x slower in Python's regex engine.
BASE_TRIGGERS = (
    "Traceback", 'File "', "Error", "error", "ERROR", "Exception", "exception", "Interrupt",
    "WARN", "Warn", "warn", "FAIL", "Fail", "fail", "Killed", "killed", "KILL", "Kill",
    "abort", "Abort", "ABRT", "timeout", "Timeout", "TIMEOUT", "timed out", "Timed out",
    "exitcode", "exit code", "return code", "exit status", "Segmentation", "core dumped",
    "signal", "Signal", "SIG", "not found", "No such", "cannot", "Cannot", "unable", "Unable",
    "not supported", "unsupported", "Unsupported", "incompatible", "mismatch", "invalid",
    "Invalid", "terminate", "NCCL", "CUDA", "version", "Version", "out of memory", "OOM",
    "Out of memory", "assert", "Assert", "Root Cause", "local_rank", "^C", "==", "Successfully installed",
    "not allowed", "not enough", "insufficient", "requires", "Please", "please", "Make sure",
    "deprecated", "refused", "Refused", "denied", "Denied", "panic", "Fatal", "fatal",
)
CONTINUATION_LINES = 6  # lines after an exception line kept as its message
_EXC_LINE = re.compile(rb"^(?:\[\w+\]:)*\s*[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure)\b:?")
_FRAME_LINE = re.compile(rb'^(?:\[\w+\]:)*\s+File "')


class Triggers:
    """Finds trigger words in a byte block. Aho-Corasick (ahocorasick_rs, ~700 MB/s) when it is
    installed; otherwise one `re` alternation (~20 MB/s: correct, only slower)."""

    def __init__(self, words: Iterable[str]):
        self.words = sorted({w for w in words if w}, key=len, reverse=True)
        encoded = [w.encode("utf-8") for w in self.words]
        try:
            import ahocorasick_rs
        except ImportError:
            self._ac = None
            self._re = re.compile(b"|".join(re.escape(w) for w in encoded))
        else:
            self._ac = ahocorasick_rs.BytesAhoCorasick(encoded)
            self._re = None

    def starts(self, block: bytes) -> list[int]:
        """Start offsets of trigger words in block, ascending."""
        if self._ac is not None:
            return [start for _, start, _ in self._ac.find_matches_as_indexes(block)]
        return [m.start() for m in self._re.finditer(block)]


def compile_triggers(extra: Iterable[str] = ()) -> Triggers:
    return Triggers([*BASE_TRIGGERS, *extra])


def _segment_bounds(block: bytes, pos: int) -> tuple[int, int]:
    """Start and end of the '\\n'- or '\\r'-delimited segment around pos."""
    nl_start = block.rfind(b"\n", 0, pos) + 1
    cr = block.rfind(b"\r", nl_start, pos)
    start = cr + 1 if cr >= 0 else nl_start
    nl_end = block.find(b"\n", pos)
    if nl_end < 0:
        nl_end = len(block)
    cr = block.find(b"\r", pos, nl_end)
    end = cr if cr >= 0 else nl_end
    return start, end


def scan(source: LogSource, triggers: Triggers, source_index: int = 0,
         stats: dict | None = None) -> Iterator[LogLine]:
    """Yield the salient lines of one log, in order, with 1-based line numbers."""
    line_base = 1  # line number at the start of the current block
    total_bytes = 0
    for block in iter_blocks(source):
        total_bytes += len(block)
        counted_to = 0
        line_at = line_base
        pos = 0
        for hit in triggers.starts(block):
            if hit < pos:
                continue  # another trigger word on a line already taken
            start, end = _segment_bounds(block, hit)
            line_at += block.count(b"\n", counted_to, start)
            counted_to = start
            segment = block[start:end]
            # take the whole physical line when it holds '\r' redraws: normalise splits them
            yield from normalise(line_at, segment.decode("utf-8", "replace"), source_index)
            pos = end + 1
            follow = 0
            if _EXC_LINE.match(segment):
                follow = CONTINUATION_LINES  # the message of an exception often continues on lines with no trigger word
            elif _FRAME_LINE.match(segment):
                follow = 1  # the source line under a traceback frame says what was being done
            if follow:
                for _ in range(follow):
                    if pos >= len(block):
                        break
                    nxt = block.find(b"\n", pos)
                    if nxt < 0:
                        nxt = len(block)
                    line_at += block.count(b"\n", counted_to, pos)
                    counted_to = pos
                    seg = block[pos:nxt]
                    if seg.strip():
                        yield from normalise(line_at, seg.decode("utf-8", "replace"), source_index)
                    pos = nxt + 1
        line_base += block.count(b"\n")
    if stats is not None:
        stats["bytes"] = stats.get("bytes", 0) + total_bytes
        stats["lines"] = stats.get("lines", 0) + line_base - 1
