"""Find the few lines of a log worth reading, without touching the rest in Python.

A log of a long run is almost all progress bars and loss dicts. One compiled alternation of
trigger words runs over each byte block in C; only the lines it hits (plus the message lines
that follow an exception) are decoded and normalised. The catalog adds its own trigger words,
so a line that a catalog pattern needs is never skipped: the catalog examples test that."""

from __future__ import annotations

import re
from bisect import bisect_left
from itertools import compress, count, repeat
from operator import itemgetter, not_
from typing import Iterable, Iterator

from .lines import EXCEPTION_KEYWORDS, LogLine, line_pieces
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
    "deprecated", "refused", "Refused", "denied", "Denied", "panic", "Fatal", "fatal", "StopIteration",
    "No module named",
)
CONTINUATION_LINES = 6  # lines after an exception line kept as its message
BOX_LINES = 400  # lines of a rich boxed traceback read after its header, up to the line under the box
_BOX_SIDE, _BOX_END = "│".encode(), "╰".encode()
_BOX_HEAD = re.compile(rb"^(?:\[\w+\]:)*\s*\xe2\x95\xad[^\n]*Traceback \(most recent call last\)")  # '╭─── Traceback'
# the rank tag an exception line starts with: its message continues only on lines with the same
# tag (under torchrun every line of a rank carries it; an untagged line is another stream)
_RANK_TAG = re.compile(rb"^\[(?:rank|default|Rank|RANK)\s?\d+\]:?")
# an exception line (lines.EXCEPTION_NAME, then its message or nothing) behind rank tags, read off the
# bytes: a dotted name whose last part ends in an exception keyword (possessive: a shorter run could
# only leave a word character where ':', '.' or the end must be, so nothing is given back)
_EXC_LINE = re.compile(rb"^(?:\[\w++\]:)*+\s*+((?:[A-Za-z_]\w*+\.)*+[A-Za-z_]\w*+)(?::|\s*$)")
_EXC_KEYWORDS = tuple(k.encode() for k in EXCEPTION_KEYWORDS)


def _prepared(segment: bytes) -> tuple[tuple[tuple[int | None, str], ...], int, bytes, bool]:
    """A segment's logical lines, how many lines after it to read as its continuation, the rank
    tag those must carry, and whether it opens a rich box (_Scanner._prepare, unremembered)."""
    pieces = tuple(line_pieces(segment.decode("utf-8", "replace")))
    # the message of an exception often continues on lines with no trigger word;
    # the source line under a traceback frame says what was being done; a rich boxed
    # traceback's frames hold no trigger word at all
    box = b"\xe2\x95\xad" in segment and _BOX_HEAD.match(segment) is not None
    follow = (BOX_LINES if box else CONTINUATION_LINES if exception_segment(segment)
              else 1 if _FRAME_LINE.match(segment) else 0)
    tag = _RANK_TAG.match(segment) if follow else None
    return pieces, follow, tag.group(0) if tag else b"", box


# torchrun's own rank tag, once, then a line that starts no other tag (most lines of a multi-rank log)
_TORCHRUN_TAG = re.compile(r"\[rank([0-9]+)\]: (?!\[)")
_BOX_FIRST = ("│", "╭", "╰", "┃")
_ASCII_SPACE = " \t\n\r\x0b\x0c"  # what bytes' \s is


def _tagged(segment: bytes) -> tuple[tuple[tuple[int | None, str], ...], int, bytes, bool] | None:
    """_prepared for '[rankN]: rest' where nothing in rest needs line_pieces' slower readings
    (no ANSI code, redraw, glued line, box or undecodable byte, and short): the same result,
    worked out directly. There, line_pieces takes no paste wrapper off (none starts '[r'),
    split_rank takes exactly the tag and its space (rest starts no other tag), and what stays is
    rest without trailing space, split before a 'Traceback (most recent call last)' inside it;
    _FRAME_LINE's optional tag and spaces are this tag and rest's leading spaces. The tests are
    made on the text (a byte test costs several times a str one). None: use _prepared."""
    if len(segment) > MEMO_MAX_BYTES:
        return None
    text = segment.decode("utf-8", "replace")
    m = _TORCHRUN_TAG.match(text)
    if (m is None or "\x1b" in text or "\r" in text or "][" in text or "╭" in text or "\ufffd" in text):
        return None
    end = m.end()
    body = text[end:].rstrip()
    rank = int(m.group(1))
    if not body:
        pieces: tuple = ()
    elif body.startswith(_BOX_FIRST):
        return None
    else:
        idx = body.find("Traceback (most recent call last)")
        if idx > 0:
            head = body[:idx].rstrip()
            pieces = ((rank, head), (rank, body[idx:])) if head.strip() else ((rank, body[idx:]),)
        else:
            pieces = ((rank, body),)
    exc = _EXC_LINE.match(segment)
    follow = (CONTINUATION_LINES if exc is not None and exc.group(1).endswith(_EXC_KEYWORDS)
              else 1 if text[end:].lstrip(_ASCII_SPACE).startswith('File "') else 0)
    return pieces, follow, segment[:end - 1] if follow else b"", False


def exception_segment(segment: bytes) -> bool:
    """True when segment is an exception line (EXCEPTION_LINE's meaning, rank tags allowed before it)."""
    m = _EXC_LINE.match(segment)
    return m is not None and m.group(1).endswith(_EXC_KEYWORDS)


_FRAME_LINE = re.compile(rb'^(?:\[\w+\]:)*\s+File "')


# A traceback printed under torchrun's rank tag in its plainest form, read as one record: the
# header, frames ('  File "...", line N, in fn', each with at most one source line under it),
# and the exception line or nothing (a traceback cut off), with no line of the same tag after it.
# Every line of one is read as _tagged reads it, and as one logical line: the header and the
# frames hold a trigger word, each source line is the continuation of its frame, the exception
# line is the continuation of a frame without a source line, or salient for a trigger word of
# its own (Record.of checks it), and nothing after the record continues it. So its lines are
# made from its bytes in one go (Record.lines), and readers that can do without them (most
# records of a log that prints the same traceback at every step) are given the record.
_RECORD = re.compile(
    rb"(?P<tag>\[rank(?P<rank>[0-9]+)\]:) Traceback \(most recent call last\):\n"
    # a frame, then its source line, unless it is the last frame (a frame's continuation is the
    # next line, whatever it is, and a frame read as one takes no continuation of its own)
    rb'(?:(?P=tag)   File "[ !#-~]++", line [0-9]++, in [ -~]*+\n'
    rb"(?:(?P=tag)     [ ]*+(?!Exception ignored in|The above exception was the direct cause|During handling of the above)"
    rb"[!-~][ -~]*+\n|(?=(?P=tag) [A-Za-z_])|(?!(?P=tag))))++"
    rb"(?P<exc>(?P=tag) [A-Za-z_][ -~]*+\n)?+"
    rb"(?!(?P=tag))"
)
_TRACEBACK_AT = b"Traceback (most recent call last):\n"
_TRACEBACK_WORDS = b"Traceback (most recent call last)"  # once in a record (_tagged splits a line before it)


class Record:
    """One traceback read as a record (see _RECORD): its bytes and where it is; its lines are
    made once, when a reader asks for them."""

    __slots__ = ("data", "key", "no", "rank", "tag", "source", "exc", "_lines")

    def __init__(self, data: bytes, no: int, rank: int, tag: int, source: int, exc: int):
        self.data, self.no, self.rank, self.tag, self.source, self.exc = data, no, rank, tag, source, exc
        self.key = data.translate(_DIGIT_BYTES)  # records with one key have lines of one shape each
        self._lines: list[LogLine] | None = None

    @property
    def closed(self) -> bool:
        """It ends in its exception line."""
        return self.exc >= 0

    def exception_text(self) -> str:
        """The exception line's text (as lines() makes it), or '' for an open record."""
        return self.data[self.exc + self.tag:-1].decode("ascii").rstrip() if self.exc >= 0 else ""

    def lines(self) -> list[LogLine]:
        if self._lines is None:
            texts = self.data.decode("ascii").split("\n")
            texts.pop()
            t, rank, source, no = self.tag, self.rank, self.source, self.no
            self._lines = [LogLine(no + k, text[t:].rstrip(), rank, source) for k, text in enumerate(texts)]
        return self._lines


def expand(lines: list[LogLine], records: list[tuple[int, Record]]) -> list[LogLine]:
    """lines with each record's lines put where it was read (records: (index in lines, record))."""
    if not records:
        return lines
    out: list[LogLine] = []
    at = 0
    for pos, rec in records:
        out += lines[at:pos]
        out += rec.lines()
        at = pos
    out += lines[at:]
    return out


# A glog line of c10d/NCCL at error or fatal severity ('E1201 14:03:22.123456 12345 socket.cpp:540]
# ...', perhaps behind rank tags) is salient even with no trigger word in it. The automaton looks
# for these heads (a line start, or the end of a rank tag, then E/F and a month digit); the hit is
# then confirmed by _GLOG_AT at the E/F.
_GLOG_HEADS = tuple(lead + sev + month for lead in (b"\n", b"\n[", b"]:", b"]: ", b"]:[")
                    for sev in (b"E", b"F") for month in (b"0", b"1"))
_GLOG_AT = re.compile(rb"[EF][01]\d[0-3]\d \d\d:\d\d:\d\d")
_GLOG_FIRST = re.compile(rb"(?:\[\w+\]: ?){0,4}\[?[EF][01]\d[0-3]\d \d\d:\d\d:\d\d")  # at a block's start (tags bounded: a line may hold 10^6)


class Triggers:
    """Finds trigger words in a byte block. Aho-Corasick (ahocorasick_rs, its DFA: ~400 MB/s on
    a trigger-dense log) when it is installed; otherwise one `re` alternation (~20 MB/s: correct,
    only slower). The glog heads above ride along in the same pass."""

    def __init__(self, words: Iterable[str], automaton: bool = True):
        self.words = sorted({w for w in words if w}, key=len, reverse=True)
        encoded = [w.encode("utf-8") for w in self.words]
        self._n = len(encoded)
        try:
            if not automaton:
                raise ImportError("the re fallback, asked for")
            import ahocorasick_rs
        except ImportError:
            self._ac = None
            self._re = re.compile(b"|".join(re.escape(w) for w in encoded))
            self._glog = re.compile(rb"(?m)^(?:\[\w+\]: ?){0,4}\[?(?=[EF][01]\d[0-3]\d \d\d:\d\d:\d\d)")
        else:
            self._ac = ahocorasick_rs.BytesAhoCorasick([*encoded, *_GLOG_HEADS],
                                                       implementation=ahocorasick_rs.Implementation.DFA)
            self._re = None

    def starts(self, block: bytes) -> list[int]:
        """Start offsets of trigger words (and confirmed glog heads) in block, ascending."""
        if self._ac is None:
            found = {m.start() for m in self._re.finditer(block)} | {m.end() for m in self._glog.finditer(block)}
            return sorted(found)
        n = self._n
        matches = self._ac.find_matches_as_indexes(block)
        out = [start for index, start, _ in matches if index < n]
        if len(out) < len(matches):  # a glog head: keep the confirmed ones, at their E/F
            glog = _GLOG_AT.match
            out = [start if index < n else end - 2 for index, start, end in matches
                   if index < n or glog(block, end - 2)]
        if block[:1] in b"[EF" and (not out or out[0] > 0) and _GLOG_FIRST.match(block):
            out.insert(0, 0)  # a glog line first in the block: no line start before it
        return out


def compile_triggers(extra: Iterable[str] = ()) -> Triggers:
    return Triggers([*BASE_TRIGGERS, *extra])


_DIGIT_BYTES = bytes.maketrans(b"0123456789", b"0000000000")
MEMO_ENTRIES = 20_000  # distinct short segments remembered with their logical lines
MEMO_MAX_BYTES = 1024  # longer segments are rarely repeated: not worth the memory
# a block after one with this many salient lines (a 4 MB block: 500 a MB), of which at most this
# share was new, is read by _dense_lines. Timed on the bench's shapes: splitting wins there even
# with 60% of the lines new (tracebacks: 27 against 34 ms/MB); with fewer salient lines, cutting
# out the lines around the trigger words is quicker than splitting the block.
DENSE_LINES = 2_000
DENSE_FRESH = 0.8
RECORDS_SPARSE = 64  # a block after one with this many records is read by _sparse_lines (records are read there)


class _Scanner:
    """Turns byte blocks into salient LogLines. What repeats is prepared once: a segment's
    logical lines and its follow-up count are remembered by its bytes, and a physical line of
    '\r' redraws is read as one redraw per shape (digits aside) plus the last one."""

    def __init__(self, triggers: Triggers, source_index: int):
        self.triggers = triggers
        self.source = source_index
        self.memo: dict[bytes, tuple[tuple[tuple[int | None, str], ...], int, bytes, bool]] = {}
        self.tag = b""  # the rank tag that the lines followed after the last salient line must carry
        self.box = False  # the last salient line opened a rich box: follow it to the box's end
        # the memo's segments known to hold a trigger word (salient wherever they are); the memo
        # also holds lines read only as the continuation of another, which are not
        self.salient: dict[bytes, tuple[tuple[tuple[int | None, str], ...], int, bytes, bool]] = {}
        # of those, the ones read as one logical line that takes no continuation: (text, rank)
        self.simple: dict[bytes, tuple[str, int | None]] = {}
        self.dense = False  # the last block's salient lines were many and mostly known: see _dense_lines
        self.newlines = 0  # the '\n' in the block block_lines read last

    def _prepare(self, segment: bytes) -> tuple[tuple[tuple[int | None, str], ...], int, bytes, bool]:
        found = self.memo.get(segment)
        if found is None:
            found = _tagged(segment) if segment.startswith(b"[rank") else None
            if found is None:
                found = _prepared(segment)
            if len(segment) <= MEMO_MAX_BYTES:
                if len(self.memo) >= MEMO_ENTRIES:
                    self.memo.clear()
                    self.salient.clear()
                    self.simple.clear()
                self.memo[segment] = found
        return found

    def _prepare_salient(self, segment: bytes) -> tuple[tuple[tuple[int | None, str], ...], int, bytes, bool]:
        """_prepare for a segment that holds a trigger word: remembered as salient too."""
        found = self._prepare(segment)
        if len(segment) <= MEMO_MAX_BYTES:
            self.salient[segment] = found
            pieces, follow = found[0], found[1]
            if len(pieces) == 1 and not follow:
                rank, text = pieces[0]
                self.simple[segment] = (text, rank)
        return found

    def _emit(self, segment: bytes, no: int, out: list[LogLine]) -> int:
        pieces, follow, self.tag, self.box = self._prepare(segment)
        for rank, text in pieces:
            out.append(LogLine(no, text, rank, self.source))
        return follow

    def _redraws(self, line: bytes, need_trigger: bool) -> list[bytes]:
        """The '\r'-separated pieces of line worth reading: the first of each shape and the last."""
        pieces = line.split(b"\r")
        kept = []
        for i in _first_of_each_shape(line.translate(_DIGIT_BYTES).split(b"\r")):
            piece = pieces[i]
            if piece.strip() and (not need_trigger or self.triggers.starts(piece)):
                kept.append(piece)
        return kept

    def _take(self, line: bytes, no: int, out: list[LogLine], need_trigger: bool) -> int:
        """Emit one physical line; return how many lines after it to read as its continuation."""
        found = self.memo.get(line)  # _emit's memo hit, first (a key holds no '\r')
        if found is not None:
            pieces, follow, self.tag, self.box = found
            for rank, text in pieces:
                out.append(LogLine(no, text, rank, self.source))
            return follow
        if line.endswith(b"\r"):
            line = line[:-1]  # a CRLF line ending, or a redraw that a newline ended
        if b"\r" in line:
            follow = 0
            for piece in self._redraws(line, need_trigger):
                follow = self._emit(piece, no, out)
            return follow
        return self._emit(line, no, out)

    def block_lines(self, block: bytes, line_at: int) -> list[LogLine]:
        """The salient lines of one block whose first line is number line_at; the ways of
        finding them give the same lines, one is quicker when most of them repeat."""
        return expand(*self.block_records(block, line_at))

    def block_records(self, block: bytes, line_at: int) -> tuple[list[LogLine], list[tuple[int, Record]]]:
        """block_lines, with the tracebacks read as records (see _RECORD) left out of the lines:
        (lines, [(index in lines where the record's lines go, record), ...])."""
        if block.count(b"\r", 0, SQUEEZE_SAMPLE) > block.count(b"\n", 0, SQUEEZE_SAMPLE):
            block = _squeeze_redraws(block)
        if self.dense:
            return self._dense_lines(block, line_at), []
        records: list[tuple[int, Record]] = []
        return self._sparse_lines(block, line_at, records), records

    def _sparse_lines(self, block: bytes, line_at: int, records: list | None = None) -> list[LogLine]:
        """Trigger words found in the whole block; each one's line cut out around it. The '\n'
        are counted on the way, once (counting one byte is a plain loop in C, no memchr).
        records: a list to put the tracebacks read as records in (else none is)."""
        first_line = line_at
        record_at = _RECORD.match if records is not None else None
        record_type, source_index, startswith = Record, self.source, block.startswith
        out: list[LogLine] = []
        append, known, source, line_type = out.append, self.salient.get, self.source, LogLine
        rfind, find, count = block.rfind, block.find, block.count
        counted_to = pos = 0
        end = len(block)
        hits = self.triggers.starts(block)
        i, n = 0, len(hits)
        taken = fresh = 0  # lines with a trigger word; those not known as salient before
        while i < n:
            hit = hits[i]
            i += 1
            if hit < pos:  # another trigger word on a line already taken
                if i < n and hits[i] < pos:  # more of them: skip them all at once
                    i = bisect_left(hits, pos, i)
                continue
            taken += 1
            start = rfind(b"\n", pos - 1 if pos else 0, hit) + 1
            line_at += count(b"\n", counted_to, start)
            counted_to = start
            if record_at is not None and startswith(_TRACEBACK_AT, hit):
                m = record_at(block, start)
                if m is not None:  # a record, unless it holds what _tagged leaves to line_pieces
                    stop = m.end()
                    data = block[start:stop]
                    if (b"][" not in data and data.count(_TRACEBACK_WORDS) == 1
                            and (stop - start <= MEMO_MAX_BYTES or max(map(len, data.split(b"\n"))) <= MEMO_MAX_BYTES)):
                        exc, tag = m.start(3), m.end(1) - start
                        # an exception line under a source line is read only if it holds a trigger word
                        if (exc < 0 or startswith(b"   File", rfind(b"\n", start, exc - 1) + 1 + tag)
                                or bisect_left(hits, exc, i) < bisect_left(hits, m.end(3), i)):
                            records.append((len(out), record_type(data, line_at, int(m.group(2)), tag + 1, source_index,
                                                                  exc - start if exc >= 0 else -1)))
                            pos = stop
                            continue
            stop = find(b"\n", hit)
            if stop < 0:
                stop = end
            line = block[start:stop]
            found = known(line)
            if found is None:
                if b"\r" in line:
                    follow = self._take(line, line_at, out, need_trigger=True)
                else:  # a new line with no redraw: _take and _emit inlined (distinct lines are many)
                    found = self._prepare_salient(line)
                fresh += 1
            if found is not None:  # a line seen before (the common case, kept short), or just prepared
                pieces, follow, tag, box = found
                if len(pieces) == 1:
                    rank, text = pieces[0]
                    append(line_type(line_at, text, rank, source))
                else:
                    for rank, text in pieces:
                        append(line_type(line_at, text, rank, source))
                pos = stop + 1
                if not follow:
                    continue
            else:  # _take left the tag and box of the last piece it emitted
                pos = stop + 1
                tag, box = self.tag, self.box
            while follow and pos < end and block.startswith(tag, pos):
                stop = find(b"\n", pos)
                stop = end if stop < 0 else stop
                if box:  # inside the box: its lines, then the one under it (the exception)
                    box, follow = _box_step(block[pos + len(tag):min(stop, pos + len(tag) + 16)], follow)
                    if follow is None:
                        break
                line_at += count(b"\n", counted_to, pos)
                counted_to = pos
                line = block[pos:stop]
                if line.strip():
                    self._take(line, line_at, out, need_trigger=False)
                pos = stop + 1
                follow -= 1
        self.dense = taken >= DENSE_LINES and fresh <= taken * DENSE_FRESH and not (records and len(records) >= RECORDS_SPARSE)
        self.newlines = line_at - first_line + count(b"\n", counted_to)
        return out

    def _dense_lines(self, block: bytes, line_at: int) -> list[LogLine]:
        """The same lines as _sparse_lines, found otherwise: the block split into lines in C, the
        lines known to be salient picked out by a C-level dict lookup each, and the trigger words
        looked for only in the other lines, joined again (a line that holds one is salient
        wherever it is, and no trigger word spans lines). The salient lines then go in order,
        as in _sparse_lines, each with the continuation lines it takes."""
        lines = block.split(b"\n")
        real = len(lines) - 1 if block.endswith(b"\n") else len(lines)  # no line after a final '\n'
        self.newlines = len(lines) - 1
        salient = self.salient
        mask = list(map(salient.__contains__, lines))
        order = list(compress(count(), mask))  # indexes of the lines known to be salient
        rest_index = list(compress(count(), map(not_, mask)))
        # every other line behind a '\n', as in the block (a glog head is a line start after
        # one), except the block's first line, which has none there either
        rest = (b"\n" if mask[0] else b"") + b"\n".join([lines[k] for k in rest_index])
        lead = 1 if mask[0] else 0
        hits = self.triggers.starts(rest)
        fresh = []
        if hits:
            rfind_rest, count_rest = rest.rfind, rest.count
            k, counted_to, pos = 0, lead, -1
            for hit in hits:
                if hit < pos:
                    continue
                start = rfind_rest(b"\n", 0, hit) + 1
                k += count_rest(b"\n", counted_to, start)
                counted_to = start
                end = rest.find(b"\n", hit)
                pos = len(rest) if end < 0 else end
                fresh.append(rest_index[k])
            order = sorted(order + fresh) if order else fresh
        else:
            # no new salient line: when every one is a simple one (one logical line, nothing
            # to follow), the loop below makes one LogLine of each, in order, and nothing else:
            # made here in C-level maps instead
            simple = list(map(self.simple.get, map(lines.__getitem__, order)))
            if None not in simple:
                self.dense = len(order) >= DENSE_LINES
                return list(map(LogLine, map(line_at.__add__, order), map(itemgetter(0), simple),
                                map(itemgetter(1), simple), repeat(self.source)))
        out: list[LogLine] = []
        append, known, source, line_type = out.append, salient.get, self.source, LogLine
        taken = 0
        free = 0  # the first line not yet read as a continuation
        for index in order:
            if index < free:
                continue
            taken += 1
            line = lines[index]
            no = line_at + index
            found = known(line)
            if found is None:
                if b"\r" in line:
                    follow = self._take(line, no, out, need_trigger=True)
                    tag, box = self.tag, self.box
                else:
                    found = self._prepare_salient(line)
            if found is not None:
                pieces, follow, tag, box = found
                if len(pieces) == 1:
                    rank, text = pieces[0]
                    append(line_type(no, text, rank, source))
                else:
                    for rank, text in pieces:
                        append(line_type(no, text, rank, source))
            free = index + 1
            while follow and free < real and lines[free].startswith(tag):
                line = lines[free]
                if box:  # inside the box: its lines, then the one under it (the exception)
                    box, follow = _box_step(line[len(tag):len(tag) + 16], follow)
                    if follow is None:
                        break
                if line.strip():
                    self._take(line, line_at + free, out, need_trigger=False)
                free += 1
                follow -= 1
        self.dense = taken >= DENSE_LINES and len(fresh) <= taken * DENSE_FRESH
        return out


SQUEEZE_PIECES = 64  # '\r' pieces of a physical line from which it is squeezed before the trigger search
SQUEEZE_SAMPLE = 1 << 16  # a block is squeezed when its first bytes hold more '\r' than '\n' (not all: a count is a loop)
SQUEEZE_HEAD = 1024  # bytes at a squeezed line's start kept whole (a continuation is judged by its first bytes)


def _squeeze_redraws(block: bytes) -> bytes:
    """block with each line of many '\r' redraws cut to the pieces that _Scanner._redraws reads of
    it (the first of each shape, digits aside, and the last; and those that start in its first
    SQUEEZE_HEAD bytes): the same pieces are read of the squeezed line, and the trigger search
    does not meet the same word again in each of 2,000 redraws (a hit each, made in Python). A
    trigger word in a piece that is dropped made its line salient, to read nothing of it."""
    parts = []
    at = 0
    find, rfind = block.find, block.rfind
    cr = find(b"\r")
    while cr >= 0:
        start = rfind(b"\n", 0, cr) + 1
        stop = find(b"\n", cr)
        if stop < 0:
            stop = len(block)
        if block.count(b"\r", start, stop) >= SQUEEZE_PIECES:
            line = block[start:stop]
            squeezed = _squeeze_line(line)
            if squeezed is not line:
                parts += (block[at:start], squeezed)
                at = stop
        cr = find(b"\r", stop)
    if not parts:
        return block
    parts.append(block[at:])
    return b"".join(parts)


def _squeeze_line(line: bytes) -> bytes:
    """One line for _squeeze_redraws (line itself when nothing would be dropped)."""
    end = b"\r" if line.endswith(b"\r") else b""  # a CRLF ending, or a redraw that a newline ended: _take drops it
    body = line[:-1] if end else line
    cut = body.find(b"\r", SQUEEZE_HEAD)
    if cut < 0:
        return line
    head, rest = body[:cut], body[cut + 1:]
    pieces = rest.split(b"\r")
    kept = _first_of_each_shape(rest.translate(_DIGIT_BYTES).split(b"\r"),
                                skip=set(head.translate(_DIGIT_BYTES).split(b"\r")))
    if len(kept) == len(pieces):
        return line
    return b"\r".join([head, *[pieces[i] for i in kept]]) + end


def _first_of_each_shape(shapes: list[bytes], skip: set[bytes] | frozenset = frozenset()) -> list[int]:
    """Indices, ascending, of the redraws worth reading: the first piece of each shape (digits
    aside) not in skip, and the last piece. Shared by _Scanner._redraws and _squeeze_line, which
    must keep the same pieces."""
    last = len(shapes) - 1
    first = dict(zip(reversed(shapes), range(last, -1, -1)))  # shape -> its first piece, built in C
    return sorted({i for shape, i in first.items() if shape not in skip} | {last})


def _box_step(head: bytes, follow: int) -> tuple[bool, int | None]:
    """A continuation line inside a rich traceback box, by its first bytes after the tag: (still in
    the box, lines left to follow); follow None when the line is no longer the box's (stop)."""
    side = head.lstrip()
    if side.startswith(_BOX_END):
        return False, 2  # the box's bottom edge, then the exception line under it
    return (True, follow) if side.startswith(_BOX_SIDE) else (True, None)


def scan(source: LogSource, triggers: Triggers, source_index: int = 0,
         stats: dict | None = None) -> Iterator[LogLine]:
    """Yield the salient lines of one log, in order, with 1-based line numbers."""
    for lines in scan_blocks(source, triggers, source_index, stats):
        yield from lines


def scan_blocks(source: LogSource | None, triggers: Triggers, source_index: int = 0,
                stats: dict | None = None, blocks: Iterable[bytes] | None = None) -> Iterator[list[LogLine]]:
    """The salient lines of one log a block at a time (a non-empty list each, in order), so
    that the readers behind take a block's lines in one call; the next block is read only
    when the caller asks for it (the phase tracker watches the blocks go by). blocks: the
    log's blocks as iter_blocks(source) yields them, when the caller has them already."""
    for lines, records in scan_records(source, triggers, source_index, stats, blocks):
        yield expand(lines, records)


def scan_records(source: LogSource | None, triggers: Triggers, source_index: int = 0,
                 stats: dict | None = None, blocks: Iterable[bytes] | None = None
                 ) -> Iterator[tuple[list[LogLine], list[tuple[int, Record]]]]:
    """scan_blocks, with the tracebacks read as records apart (_Scanner.block_records)."""
    scanner = _Scanner(triggers, source_index)
    line_base = 1  # line number at the start of the current block
    total_bytes = 0
    for block in iter_blocks(source) if blocks is None else blocks:
        total_bytes += len(block)
        lines, records = scanner.block_records(block, line_base)
        if lines or records:
            yield lines, records
        line_base += scanner.newlines
    if stats is not None:
        stats["bytes"] = stats.get("bytes", 0) + total_bytes
        stats["lines"] = stats.get("lines", 0) + line_base - 1
