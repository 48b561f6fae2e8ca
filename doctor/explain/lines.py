"""One log line made comparable: colour codes gone, the rank prefix that launchers add
taken off and remembered, so that ranks interleaved in one log can be told apart.

Every expression here is linear in the line's length (a line may be megabytes long), and a
line over MAX_LINE_CHARS keeps its rank prefix and the start of its message, not the start of
a run of repeated prefixes."""

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
# pdsh / deepspeed multi-node without a rank tag: 'gpu-b: ...', 'node001: ...', '10.0.0.2: ...'.
# The token up to the first ':' is read greedily (linear: ':' is not in the class) and checked in
# Python: an IPv4 address, or a name that starts with a letter and has a digit or '-' before any '.'.
_HOST_TOKEN = re.compile(r"([\w.-]+): (?=\S)")
_IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
_NOT_HOSTS = (".py", ".cc", ".cpp", ".h", ".so")
_BOX = "│╭╰┃╮╯─ "  # rich's boxed tracebacks
# inside rich's box: a frame '/path/file.py:123 in fn', and a source line '  40 │ code' or '❱ 41 │ code'
RICH_FRAME = re.compile(r"(?P<file>(?:/|~/|\.{1,2}/|[A-Za-z]:[\\/]|<)\S*?):(?P<line>\d+) in (?P<func>[\w<>.]+)")
RICH_PATH_PART = re.compile(r"(?:/|~/|\.{1,2}/|[A-Za-z]:[\\/]|<)\S*")  # a frame's path that rich wrapped
_RICH_SOURCE = re.compile(r"(?:❱ ?)?\d+(?: +│.*)?")
# an error glued to a progress bar that had no newline: '…155.57 examples/s][E ProcessGroupNCCL.cpp:475] …'
_GLUED = re.compile(r"(?<=\])(?=\[(?:rank\d+\]:|default\d+\]:|[EW]\d{0,4} ))")
# '[Rank 1]', '[PG 0 Rank 1]', '[PG ID 0 PG GUID 0(default_pg) Rank 1]' (ProcessGroupNCCL's logPrefix)
_GLOG_RANK = re.compile(r"\[(?:Rank|rank|PG [^\]\[]{0,60}?Rank) (\d+)\]")
_ONE_PREFIX = re.compile(r"\[(?:rank|default|Rank|RANK)\s?\d+\]:?\s?")
MAX_LINE_CHARS = 4000  # matching looks at no more of a line than this

# What a paste or a log collector puts in front of every line, taken off before the rank prefix:
# markdown quote markers ('> '), line numbers of a numbered paste ('[1918] '), Ray worker tags
# ('(RayTrainWorker pid=4411, ip=10.0.0.3) '), mpirun's '[1,0]<stderr>:' (the second number is the
# rank), and a container runtime's ISO timestamp ('2024-05-01T10:00:00.123Z stderr F ').
_PASTE_WRAPPER = re.compile(
    r"^(?:(?:>[ \t]?)+"
    r"|\[\d{1,7}\][ \t]"
    r"|\((?:[\w.-]+ )?pid=\d+(?:, ip=[\d.]+)?\)[ \t]"
    r"|\[\d{1,5},(?P<mpirank>\d{1,5})\]<std(?:out|err)>:[ \t]?"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?[ \t]+(?:(?:stdout|stderr)[ \t]+[FP][ \t]+)?)"
)
# The name of an exception as Python prints it on a traceback's last line, one definition for
# every reader: 'ValueError', 'torch.OutOfMemoryError', 'KeyboardInterrupt', 'SystemExit',
# 'StopIteration'. The keywords end it (a dotted module path may come before).
EXCEPTION_KEYWORDS = ("Error", "Exception", "Interrupt", "Exit", "Failure", "StopIteration", "StopAsyncIteration")
EXCEPTION_NAME = r"(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*?)?(?:" + "|".join(EXCEPTION_KEYWORDS) + ")"
# An exception line: its name, then ': message' or nothing ('KeyboardInterrupt'), on a stripped line.
EXCEPTION_LINE = re.compile(rf"^(?P<type>{EXCEPTION_NAME})(?::\s?(?P<msg>.*))?$")
# Lines a uniformly indented paste (a markdown list item, a 4-space code block) moves off column 0;
# none of them is the source line of a traceback frame.
_INDENTED_ANCHOR = re.compile(
    r"[ \t]+(?=\[(?:rank|default)\d+\]:|Traceback \(most recent call last\)"
    rf"|{EXCEPTION_NAME}(?::\s|$))"
)


@dataclass(slots=True)
class LogLine:
    """A salient line: where it is (1-based line number), whose it is (rank or None), what it says."""

    no: int
    text: str
    rank: int | None = None
    source: int = 0  # index of the log file when several are explained together


class InertLines:
    """A bounded set of line texts that a reader found to change nothing, so that a line a run
    prints at every step is read once. Long lines are not kept; a full set starts again."""

    MAX_ENTRIES = 50_000
    MAX_CHARS = 600

    def __init__(self) -> None:
        self._texts: set[str] = set()

    def __contains__(self, text: str) -> bool:
        return text in self._texts

    @property
    def texts(self) -> set[str]:
        """The set itself (emptied in place when full), for a loop that tests many lines."""
        return self._texts

    def add(self, text: str) -> None:
        if len(text) <= self.MAX_CHARS:
            if len(self._texts) >= self.MAX_ENTRIES:
                self._texts.clear()
            self._texts.add(text)


class LineMemo:
    """A bounded map from line text to what a reader made of it (same rules as InertLines)."""

    def __init__(self) -> None:
        self._known: dict[str, object] = {}

    def get(self, text: str):
        return self._known.get(text)

    def put(self, text: str, value) -> None:
        if len(text) <= InertLines.MAX_CHARS:
            if len(self._known) >= InertLines.MAX_ENTRIES:
                self._known.clear()
            self._known[text] = value


class CappedList(list):
    """A list whose append drops what exceeds a cap: `per_key` items for each key(item), `total`
    in all, so that a log of a million errors keeps memory flat; the first ones are kept."""

    def __init__(self, total: int, per_key: int | None = None, key=None):
        super().__init__()
        self.total, self.per_key, self.key = total, per_key, key
        self._counts: dict = {}

    def kept(self, k) -> int:
        """How many items with key k were kept."""
        return self._counts.get(k, 0)

    def append(self, item) -> None:
        if len(self) >= self.total:
            return
        if self.key is not None:
            k = self.key(item)
            n = self._counts.get(k, 0)
            if n >= self.per_key:
                return
            self._counts[k] = n + 1
        super().append(item)


def _host_prefix_end(text: str) -> int:
    """End of a pdsh-style 'host: ' prefix at the start of text, or 0."""
    m = _HOST_TOKEN.match(text)
    if not m:
        return 0
    host = m.group(1)
    if host.endswith(_NOT_HOSTS):
        return 0
    if _IPV4.fullmatch(host):
        return m.end()
    if not host[0].isascii() or not host[0].isalpha():
        return 0
    head = host.split(".", 1)[0][1:]
    if "-" in head or any(c.isdecimal() for c in head):
        return m.end()
    return 0


def split_rank(text: str) -> tuple[int | None, str]:
    """Return (rank, text without the launcher's rank prefix)."""
    m = _RANK_PREFIX.match(text)
    if m:
        return int(m.group(1)), text[m.end():]
    m = _NUMERIC_PREFIX.match(text)
    if m:
        return int(m.group(1)), text[m.end():]
    end = _host_prefix_end(text)
    if end:
        rest = text[end:]
        rank, body = split_rank(rest) if rest.startswith("[") else (None, rest)
        return rank, body
    if text.startswith(("[E ", "[W ", "[E", "[rank", "E0", "E1", "W0", "W1")):
        g = _GLOG_RANK.search(text, 0, 200)
        if g:
            return int(g.group(1)), text
    return None, text


def _prefix_run(text: str, pos: int) -> tuple[int, int]:
    """(start of the last prefix, end of the run) of the rank prefixes from pos; a repeated
    prefix is skipped by doubling and halving comparisons (memcmp), not one regex step each."""
    last = end = pos
    m = _ONE_PREFIX.match(text, pos)
    while m:
        prefix = m.group(0)
        k = 1
        while text.startswith(prefix * (2 * k), end):
            k *= 2
        lo, hi = k, 2 * k  # prefix*lo matches at end, prefix*hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if text.startswith(prefix * mid, end) else (lo, mid)
        last = end + (lo - 1) * len(prefix)
        end += lo * len(prefix)
        m = _ONE_PREFIX.match(text, end)
    return last, end


def _shorten(text: str) -> str:
    """A line cut to MAX_LINE_CHARS; a leading run of repeated rank prefixes is first squeezed
    to its last prefix, so that the message behind it survives the cut."""
    start = _host_prefix_end(text[:300])
    last, end = _prefix_run(text, start)
    if end - start > MAX_LINE_CHARS // 4:
        text = text[:start] + text[last:]
    return text[:MAX_LINE_CHARS]


def line_pieces(raw: str) -> list[tuple[int | None, str]]:
    """The logical lines of one physical segment as (rank, text): ANSI removed, progress redraws
    split, a traceback header glued to a progress bar split off, rank prefix recognised."""
    text = strip_ansi(raw)
    if len(text) > MAX_LINE_CHARS:
        text = _shorten(text)
    pieces = text.split("\r") if "\r" in text else [text]
    if "][" in text:
        pieces = [part for p in pieces for part in _GLUED.split(p)]
    out: list[tuple[int | None, str]] = []
    for piece in pieces:
        piece = piece.rstrip()
        if not piece.strip():
            continue
        if piece.startswith("^C"):
            piece = piece[2:]
            out.append((None, "^C"))
        wrapped_rank = None
        for _ in range(3):
            w = _PASTE_WRAPPER.match(piece)
            if not w or not w.end():
                break
            if w.group("mpirank") is not None:
                wrapped_rank = int(w.group("mpirank"))
            piece = piece[w.end():]
        if piece[:1] in " \t":
            a = _INDENTED_ANCHOR.match(piece)
            if a:
                piece = piece[a.end():]
        if not piece.strip():
            continue
        rank, body = split_rank(piece)
        if rank is None:
            rank = wrapped_rank
        if body[:1] in "│╭╰┃":
            body = _unbox(body)
            if not body:
                continue
        idx = body.find("Traceback (most recent call last)")
        if idx > 0:
            head = body[:idx].rstrip()
            if head.strip():
                out.append((rank, head))
            body = body[idx:]
        out.append((rank, body))
    return out


def _unbox(body: str) -> str:
    """A line of a rich box without its frame; in a boxed traceback, a frame line reads as Python's
    own ('  File "/path/file.py", line 123, in fn'), a source line is indented as Python's is, so that
    frames, matching and the failing frame work the same on both."""
    inner = body.strip(_BOX)
    if body[:1] != "│" or not inner:
        return inner
    m = RICH_FRAME.fullmatch(inner)
    if m:
        return f'  File "{m.group("file")}", line {m.group("line")}, in {m.group("func")}'
    if _RICH_SOURCE.fullmatch(inner) or body[1:].lstrip(" ")[:1] in ("│", "╭", "╰"):  # source, or a nested panel (locals)
        return "    " + inner
    return inner


def normalise(no: int, raw: str, source: int = 0) -> list[LogLine]:
    """line_pieces as LogLines at line number no."""
    return [LogLine(no, text, rank, source) for rank, text in line_pieces(raw)]
