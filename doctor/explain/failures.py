"""Read the failure out of a multi-rank log: Python tracebacks per rank, torchrun's
ChildFailedError summary, launcher exit codes, signals, NCCL and compiler errors.

The root cause is the first failing rank's own error: not the SIGTERM its neighbours got, not
the launcher's summary, not the wrapper exception of the CLI that started torchrun, and not a
collective timeout or lost-peer error that another rank printed after it (a consequence: the
rank it waited for had already failed)."""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable

from ..catalog.patterns import guard
from .lines import EXCEPTION_LINE, RICH_FRAME, RICH_PATH_PART, CappedList, InertLines, LogLine

SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
           9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}

_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line \d+')
# Exceptions that only wrap or report a failure that happened elsewhere.
WRAPPER_EXCEPTIONS = guard(re.compile(
    r"ChildFailedError|SignalException|^subprocess\.CalledProcessError: Command '\[?'?(?:torchrun|deepspeed|accelerate|ninja|python\S*', '-m', 'torch\.distributed)"
    # torch.multiprocessing.spawn re-raising a worker's error in the parent ('-- Process N terminated
    # with the following error:' and the worker's own traceback after it; torch/multiprocessing/spawn.py)
    r"|ProcessRaisedException"
))  # guard: every exception line is tested, and a substring test rules out most
# mp.spawn before torch 1.9 raised a plain Exception with the worker's traceback as its message
_SPAWN_FILE = "multiprocessing/spawn.py"
# a C++ backtrace line under a c10::Error ('frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(...) +
# 0x23d (0x7f.. in .../libtorch_cuda.so)'): a function name, never an error of its own
_CPP_FRAME = re.compile(r"^frame #\d+: ")
# a c10/glog warning-level line ('[W625 23:35:35.303797152 TCPStore.cpp:125] [c10d] recvValue failed on
# SocketImpl(...): Connection reset by peer', 'W1203 10:12:01.118000 140211 ...', torch 1.x '[W socket.cpp:426] ...'):
# the process goes on after it (ranks finishing at different times print TCPStore resets at exit, a
# client retries its connect); when the run did fail, its error-level line or exception follows
_GLOG_WARNING = re.compile(r"^\[?W\d{3,4} \d\d:\d\d:\d\d\.\d+|^\[W [\w./-]+:\d+\]")  # MDD or MMDD: torch prints W625 in June
# Python's warnings module: '<file>.py:<line>: <Category>Warning: <msg>' (warnings.formatwarning); the run
# goes on, so a CUDA/cuDNN status named in it ('UserWarning: Plan failed with a cudnnException: ...
# CUDNN_STATUS_NOT_SUPPORTED') is no failure
_PY_WARNING = re.compile(r"^\S+\.py:\d+: [A-Z]\w*Warning: ")
_SIGNAL_EXCEPTION = re.compile(r"SignalException: Process \d+ got signal: (\d+)")
FORWARDED_EXITS = (-15, -2, -1)  # what workers exit with when the launcher forwards its SIGTERM/SIGINT/SIGHUP
_ROOT_CAUSE_HEADER = re.compile(r"Root Cause \(first observed failure\)")
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_LAUNCHER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
_DS_LAUNCHER_EXIT = re.compile(r"exits with return code = (-?\d+)")
_NONZERO_EXIT = guard(r"(?:returned non-zero exit status|exit status|exited with code) (-?[1-9]\d*)")

# Lines that are a failure on their own, whatever comes after them; (kind, pattern).
PRIMARY_LINES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("signal", re.compile(r"^(?:Killed|Segmentation fault|Bus error|Aborted|Illegal instruction|Floating point exception)(?: \(core dumped\))?\b|\bSegmentation fault \(core dumped\)|: line \d+: +\d+ (?:Killed|Segmentation fault|Bus error|Aborted)")),
    ("signal", re.compile(r"^Fatal Python error:|^terminate called (?:after throwing|without an active exception)")),
    ("nccl", re.compile(r"Watchdog caught collective operation timeout|NCCL error|\bnccl(?:System|Internal|UnhandledCuda|InvalidUsage|InvalidArgument|Remote)Error\b|ProcessGroupNCCL.*(?:timed out|Timeout)|watchdog got stuck for \d+|DistBackendError|socketStartConnect|Connection reset by peer|ncclCommInitRank failed|"
                         # nccl-tests (src/common.h NCCLCHECK/CUDACHECK): '<host>: Test NCCL failure common.cu:777 'unhandled system error''
                         r"\bTest (?:NCCL|CUDA) failure \S+:\d+")),
    ("cuda", re.compile(r"CUDA out of memory|CUDA error: |CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|cudaError\w+|device-side assert triggered|no CUDA GPUs are available|invalid device ordinal")),
    ("compiler", re.compile(r"^(?:\S+:\d+(?::\d+)?: )?(?:fatal )?error: |^FAILED: |^ERROR: No supported gcc|^ninja: build stopped|^collect2: error|^/usr/bin/ld: cannot find|error: command '.*' failed|nvcc fatal|^\S+: \d+: \S+: not found$|^/bin/(?:ba)?sh: .*not found")),
    ("cli", re.compile(r"^\S+: error: (?:the following arguments are required|unrecognized arguments|argument )|command not found$|^usage: .*\n?.*error:")),
    # the interpreter refusing what it was told to run, before any traceback: 'python3: can't open file',
    # 'python: No module named x', 'python3: Error while finding module specification for 'x.py'' (python -m,
    # torchrun -m, deepspeed --module); a launcher's worker prints nothing else
    ("cli", re.compile(r"^\S*python[\w.]*: (?:can't open file |Error while finding module specification for |No module named )")),
    ("oom-killer", re.compile(r"Out of memory: Kill(?:ed)? process|oom-kill|oom_reaper: reaped process|"
                              r"Detected \d+ oom.kill event|cgroup out-of-memory handler|task \d+: Out Of Memory")),
)
PRIMARY_LINES = tuple((kind, guard(p)) for kind, p in PRIMARY_LINES)  # most lines need no regex at all
# What a rank prints when a collective it waits in times out, or when the peer it talks to is
# gone: the consequence of another rank's failure, never the root when an own error came first.
# Wording from torch's c10d (ProcessGroupNCCL.cpp, ProcessGroupGloo/gloo tcp pair.cc and
# unbound_buffer.cc, TCPStore) and NCCL's own messages, as compiled into torch 2.x.
COLLECTIVE_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out|"
    r"NCCL operation timed out|timed out in blocking wait|Exception \(either an error or timeout\) detected by watchdog|"
    r"Timed out waiting \d+ms for (?:recv|send) operation|Heartbeat monitor timed out|watchdog got stuck for|"
    r"Received a dump signal due to a collective timeout|Observed flight recorder dump signal|"
    # (not when the exception it carries is a CUDA error of this rank: 'watchdog thread terminated with
    # exception: CUDA error: an illegal memory access was encountered' is the rank's own kernel fault)
    r"watchdog thread terminated with exception(?!: CUDA error)|"
    # ProcessGroupNCCL's own account of the timed-out work, printed next to (often before) the
    # watchdog line: 'Timeout at NCCL work: N, last enqueued NCCL work: M, last completed NCCL
    # work: K.' (torch 2.2-2.5), 'failure detected by watchdog at work sequence id: N PG status:
    # last enqueued work: ...' (2.6+), 'Some NCCL operations have failed or timed out' (1.x-2.x),
    # and a peer's timeout relayed through the store ('Received a global timeout from another rank')
    r"Timeout at NCCL work: \d+|failure detected by watchdog at work sequence id|"
    r"Some NCCL operations have failed or timed out|Received a global timeout from another rank|"
    r"NCCL timeout in: |Last enqueued NCCL work: |are the lagging ranks that caused this timeout"
)
PEER_LOST = re.compile(
    r"Connection closed by (?:remote )?peer|Connection reset by peer|typically caused by a remote worker crashing|"
    r"remote process exited or there was a network error|remote process exiting prematurely|ncclRemoteError|"
    r"Failed to recv, got 0 bytes|recvValue failed|Broken pipe|NCCL communicator was aborted|"
    r"ProcessGroupNCCL\b.*\babort|terminate called after throwing an instance of 'c10::DistBackendError'"
)
# the heartbeat monitor taking a process down because its watchdog thread is stuck (torch >= 2.3):
# the failure only when the log holds no other error (it follows a timeout or a peer's crash)
_HEARTBEAT_ABORT = re.compile(r"Heartbeat monitor timed out|watchdog got stuck for \d+")
# Python's lines between chained tracebacks
_CHAIN_MARKS = ("The above exception was the direct cause of the following exception",
                "During handling of the above exception, another exception occurred")
MAX_CHAIN_MARKS = 10_000
_MARK_HEADS = "ETD"  # first letters of 'Exception ignored in', the chain marks and 'Traceback (most recent call last)'
DETAIL_LINES = 3  # message lines read under a header exception ('Error(s) in loading state_dict for X:')
DETAIL_RANK_GAP = 8  # lines of other ranks that may sit between a ranked header exception and its message
# pydantic's ValidationError names the model on its own line and the fields under it
# ('1 validation error for DeepSpeedZeroConfig' / 'aio' / '  Extra inputs are not permitted ...'): a header too
_PYDANTIC_HEADER = re.compile(r"\d+ validation errors? for \w+$")


def _is_header(stripped: str) -> bool:
    """An exception line whose message is on the lines under it."""
    return stripped.endswith(":") or _PYDANTIC_HEADER.search(stripped) is not None
MAX_CHAIN_LINKS = 4
CHAIN_GAP_LINES = 400  # from one link's exception line to the next one's
# a process taking itself down after the watchdog fired ('Fatal Python error: Aborted')
_ABORT_AFTER = re.compile(r"Fatal Python error: Aborted|^Aborted\b")


def is_consequence(text: str) -> bool:
    """True for a collective timeout or a lost-peer error: the echo of another rank's failure."""
    return bool(COLLECTIVE_TIMEOUT.search(text) or PEER_LOST.search(text))


# A rank's own error-level log line: DeepSpeed's logger ('[2026-12-01 14:03:22,123] [ERROR]
# [engine.py:2516:_configure_basic_optimizer] msg'), LLaMA-Factory's and transformers'
# ('[ERROR|2026-12-01 14:03:22] llamafactory.hparams.model_args:251 >> msg', '[ERROR|modeling_utils.py:3298]
# 2026-12-01 14:03:22,123 >> msg'), glog/c10 ('E1201 14:03:22.123456 12345 ProcessGroupNCCL.cpp:1234] msg',
# '[E1201 14:03:22.123456789 ProcessGroupNCCL.cpp:1234] msg') and torch's older '[E ProcessGroupNCCL.cpp:475] msg'.
# Like NCCL WARN lines they are no failure on their own (healthy runs log some errors and go on);
# when the run fails, the failing rank's first one is its own error.
LOGGED_ERROR = re.compile(
    r"^(?:\[\d{4}-\d\d-\d\d[\d:,. ]{0,20}\]\s+)?(?:(?P<logger>[\w.]+):\s+)?\[(?:ERROR|CRITICAL|FATAL)\]\s+"
    r"(?:\[(?P<ds_where>[\w.-]+:\d+:\w+)\]\s*)?(?P<msg1>\S.*)"
    r"|^\[(?:ERROR|CRITICAL)\|(?P<lf_head>[^\]]{1,80})\](?P<lf_where>[^>]{0,120})>>\s*(?P<msg2>\S.*)"
    r"|^\[?[EF]\d{3,4} \d\d:\d\d:\d\d\.\d+(?: +\d+)? +(?P<glog_where>[\w./-]+:\d+)\]\s*(?P<msg3>\S.*)"
    r"|^\[[EF] (?P<old_where>[\w./-]+:\d+)\]\s*(?P<msg4>\S.*)"
)
# error-level lines that only echo a failure: the launcher's (torchrun's elastic agent, the deepspeed
# launcher), and ProcessGroupNCCL's follow-up of a timeout (dumps, flight recorder, abort)
LOGGED_ECHO = re.compile(
    r"torch[./]distributed[./]elastic|exits with return code|sigkill_handler|"
    r"[Dd]ump|[Ff]light [Rr]ecorder|failure detected by watchdog|Timeout at NCCL work|signal dumping|"
    r"Terminating the process after|[Aa]borting all communicators|abort(?:ing|ed)? (?:the )?(?:NCCL )?comm|"
    r"[Ww]atchdog|[Hh]eartbeat|hasn't been destroyed|has NOT been destroyed|failed or timed out|data inconsistency"
)
LOGGED_WINDOW = 500  # lines before the run's first failure in which a logged error may be its root
LOGGED_TRACEBACK_LINES = 60  # a traceback the same rank printed this soon after its logged error raised it


def logged_error(text: str) -> re.Match[str] | None:
    """The match of a rank's own error-level log line (not an echo), or None."""
    if "ERROR" not in text and "CRITICAL" not in text and "FATAL" not in text and not text[:2].lstrip("[")[:1] in ("E", "F"):
        return None
    m = LOGGED_ERROR.match(text)
    if m is None or LOGGED_ECHO.search(text):
        return None
    return m


def logged_message(text: str) -> str:
    """A logged error's message without the logger's prefix (time, level, location); text if not one."""
    m = logged_error(text.strip())
    if m is None:
        return text
    return next(g for g in (m.group("msg1"), m.group("msg2"), m.group("msg3"), m.group("msg4")) if g is not None)


def logged_origin(text: str) -> tuple[str, int, str, str | None] | None:
    """Where a logged error says it was logged: (file or module, line, function, package), from the
    logger's own location field ('[engine.py:2516:fn]', 'llamafactory.hparams.model_args:251',
    '[ERROR|modeling_utils.py:3298]', 'ProcessGroupNCCL.cpp:1234]'); None when it names none."""
    m = logged_error(text.strip())
    if m is None:
        return None
    if m.group("ds_where"):  # DeepSpeed's logger is the one that prints '[file:line:function]'
        file, line, func = m.group("ds_where").rsplit(":", 2)
        return file, int(line), func, "deepspeed"
    if m.group("lf_head") is not None:
        for part in (m.group("lf_head"), m.group("lf_where")):
            w = _LOGGER_WHERE.search(part)
            if w:
                name = w.group(1)
                if name.endswith(".py"):  # transformers prints the file name
                    return name, int(w.group(2)), "", "transformers"
                return name.replace(".", "/") + ".py", int(w.group(2)), "", name.split(".")[0]
        return None
    where = m.group("glog_where") or m.group("old_where")
    if where:
        file, line = where.rsplit(":", 1)
        return file, int(line), "", "torch" if file.endswith((".cpp", ".cc", ".h", ".hpp")) else None
    return None


_LOGGER_WHERE = re.compile(r"([A-Za-z_][\w.]*):(\d+)\b")


# NCCL WARN lines are not a failure on their own (healthy runs print some: a missing
# libibverbs on a node without InfiniBand); when the run fails, the last ones printed shortly
# before the first error usually say why, so they may be its root.
NCCL_WARN = re.compile(r"NCCL WARN")
BENIGN_NCCL_WARN = re.compile(r"Failed to open libibverbs|NET/Plugin|Could not find|libnccl-net")
WARN_BEFORE_ERROR_LINES = 200
MAX_EVENTS, MAX_EVENTS_EACH, MAX_OPEN_TRACEBACKS = 100_000, 256, 1024
UNRAISABLE = re.compile(r"^Exception ignored in")  # Python's unraisable hook: an error in __del__, not a failure
UNRAISABLE_WINDOW = 30
# Lines that say something failed but only echo a failure reported elsewhere.
SECONDARY_LINES = guard(re.compile(
    r"closing signal SIGTERM|closing signal SIGINT|Killing subprocess|sigkill_handler|"
    r"Some NCCL operations have failed or timed out|To avoid data inconsistency|"
    r"NCCL watchdog thread terminated(?! with exception: CUDA error)|Received \d+ death signal|Received Signals\.|ChildFailedError"
))  # guard: a substring test first, most lines need no regex


@dataclass
class Traceback:
    """One traceback as printed by one rank: frames (file names), the exception and its message."""

    rank: int | None
    start: int  # line number of 'Traceback (most recent call last):'
    files: list[str] = field(default_factory=list)
    frames: list[LogLine] = field(default_factory=list)
    exception: LogLine | None = None
    exc_type: str = ""
    message: list[LogLine] = field(default_factory=list)
    source: int = 0
    indent: int = 2  # of its frame lines
    wrapped: LogLine | None = None  # the first part of a frame line that rich's box wrapped
    code: LogLine | None = None  # the source line Python printed under the innermost frame (the raising statement)

    def add_frame(self, line: LogLine, file: str) -> None:
        """A '  File "...", line N, in f' line: the first one sets the frames' indent."""
        if not self.frames:
            self.indent = len(line.text) - len(line.text.lstrip())
        self.files.append(file)
        self.frames.append(line)
        self.code = None


@dataclass
class FailureEvent:
    kind: str  # exception, logged, signal, nccl, cuda, compiler, cli, oom-killer, exit
    line: LogLine
    primary: bool
    exit_code: int | None = None
    traceback: Traceback | None = None
    # the lines that carry the message when the exception line does not: the continuation of a
    # header ('RuntimeError: Error(s) in loading state_dict for X:' then '\tWhile copying ...'),
    # the assert statement above an AssertionError
    detail: list[LogLine] = field(default_factory=list)


@dataclass
class FailureAnalysis:
    events: list[FailureEvent]
    failed_rank: int | None  # torchrun's 'Root Cause' rank, or the rank of the root error
    exit_codes: list[int]
    root: FailureEvent | None
    root_lines: set[tuple[int, int]]  # (source, line no) of the root error and its traceback
    launcher_rank: int | None = None  # the rank torchrun's summary (or 'failed ... local_rank') named
    consequences: list[FailureEvent] = field(default_factory=list)  # timeouts and lost peers after the root
    chained: list[FailureEvent] = field(default_factory=list)  # exceptions Python printed as chained to the root
    root_detail: list[LogLine] = field(default_factory=list)  # the lines carrying the root's message (FailureEvent.detail)

    @property
    def failure(self) -> bool:
        return self.root is not None


_READ_LINES = object()
RECORD_SHAPES = 4_096  # exception lines' shapes remembered (each at most scan.MEMO_MAX_BYTES)


class FailureReader:
    """Fed the salient lines in order; builds tracebacks per rank and the failure events."""

    def __init__(self) -> None:
        # bounded, so that memory stays flat on a log of a million errors (the first ones are kept)
        self.events: list[FailureEvent] = CappedList(MAX_EVENTS, MAX_EVENTS_EACH, _event_key)
        # oldest first, so that the oldest is dropped in O(1) (a plain dict's first key is found by
        # walking past the deleted ones: slow when tracebacks of a thousand ranks stay open)
        self._open: OrderedDict[tuple[int, int | None], Traceback] = OrderedDict()
        self._in_summary = False
        self._summary_rank: int | None = None
        self.summary_exit: int | None = None
        self.failed_rank: int | None = None
        # the launcher's 'failed (exitcode: N) local_rank: K' names a LOCAL rank; on a multi-node job the
        # ranks' own lines carry the global one ('[rank11]:'), which the summary's 'rank : 11 (local_rank: 3)'
        # gives: the summary's rank replaces a local one taken before it
        self._failed_rank_is_local = False
        self.exit_codes: list[int] = []
        self.nccl_warnings: list[LogLine] = []
        self.logged: list[FailureEvent] = CappedList(MAX_EVENTS, MAX_EVENTS_EACH, _event_key)  # error-level log lines
        self._unraisable_until: dict[tuple[int, int | None], int] = {}
        # (source, rank, line, direct): "The above exception was the direct cause ..." (direct) or "During handling ..."
        self._chain_marks: list[tuple[int, int | None, int, bool]] = []
        self._inert = InertLines()  # lines that changed nothing: a warning printed every step is read once
        self._detail_for: dict[tuple[int, int | None], FailureEvent] = {}  # a header exception awaiting its message lines
        self._record_exceptions: dict = {}  # exception line's shape -> what it is (_record_exception)

    def feed_block(self, lines: list[LogLine], records: list | tuple = ()) -> LogLine | None:
        """feed() each line in turn; return the first line that added a primary event or a logged
        error (the phase tracker keeps the block it is in), or None. A line that changed nothing
        before is passed over here, under feed()'s own condition for that, without a call.
        records: tracebacks read as records (scan.Record), as (index in lines, record): each is
        read where its lines would be, as they would be (feed_record)."""
        if not records:
            return self._feed_lines(lines, None)
        pin = None
        at = 0
        for pos, rec in records:
            if pos > at:
                pin = self._feed_lines(lines[at:pos], pin)
                at = pos
            found = self.feed_record(rec)
            if pin is None:
                pin = found
        if at < len(lines):
            pin = self._feed_lines(lines[at:], pin)
        return pin

    def _feed_lines(self, lines: list[LogLine], pin: LogLine | None) -> LogLine | None:
        inert = self._inert.texts  # the set itself: a membership test without a Python call
        opened = self._open
        events, logged = self.events, self.logged
        read = self._read  # feed() without its own test of the condition just tested here
        for line in lines:
            if (line.text in inert and not self._in_summary and not self._detail_for
                    and (not opened or (line.source, line.rank) not in opened)):
                continue
            if pin is not None:
                read(line)
                continue
            n_events, n_logged = len(events), len(logged)
            read(line)
            if (len(events) > n_events and events[-1].primary) or len(logged) > n_logged:
                pin = line
        return pin

    def feed_record(self, rec) -> LogLine | None:
        """A traceback read as a record (scan.Record): what feeding its lines would do, and
        what _feed_lines would return. Its lines are made only where they can matter: a
        traceback left open is kept as the record until a line of its rank comes (_traceback),
        and a closed one whose exception event would be dropped (that rank's events are full)
        only closes the traceback it opened; anything else is read line by line."""
        key = (rec.source, rec.rank)
        opened = self._open
        if rec.exc < 0:
            # the header: it ends a header exception's message and opens the traceback (an
            # open one of the same rank is replaced where it is); then only frames and source lines
            if self._detail_for:
                self._detail_for.pop(key, None)
            if key in opened:
                opened[key] = rec
            else:
                opened[key] = rec
                if len(opened) > MAX_OPEN_TRACEBACKS:
                    opened.popitem(last=False)
            return None
        if key not in self._unraisable_until:
            shape = rec.key[rec.exc:]  # the exception line's shape says what it is to the reader
            primary = self._record_exceptions.get(shape)
            if primary is None:
                primary = self._record_exception(rec, shape)
            if primary is not _READ_LINES:
                events = self.events
                if len(events) >= events.total or events.kept((rec.source, rec.rank, "exception", primary)) >= events.per_key:
                    if self._detail_for:
                        self._detail_for.pop(key, None)
                    if key in opened:
                        del opened[key]
                    elif len(opened) >= MAX_OPEN_TRACEBACKS:
                        opened.popitem(last=False)  # the header's traceback pushed the oldest out
                    return None
        return self._feed_lines(rec.lines(), None)

    def _record_exception(self, rec, shape: bytes):
        """Whether a closed record's exception would be a primary event (its shape says it), or
        _READ_LINES where the record must be read line by line (not an exception line to the
        reader, a header exception whose message follows, a CalledProcessError)."""
        stripped = rec.exception_text().strip()
        em = EXCEPTION_LINE.match(stripped)
        if em is None or _is_header(stripped) or em.group("type").endswith("CalledProcessError"):
            found = _READ_LINES
        else:
            found = not WRAPPER_EXCEPTIONS.search(stripped)
        if len(self._record_exceptions) >= RECORD_SHAPES:
            self._record_exceptions.clear()
        self._record_exceptions[shape] = found
        return found

    def _traceback(self, key: tuple[int, int | None]) -> "Traceback | None":
        """The open traceback of key, made from its record if it is one (left where it is)."""
        tb = self._open.get(key)
        if tb is None or type(tb) is Traceback:
            return tb
        lines = tb.lines()
        head = lines[0]
        made = Traceback(head.rank, head.no, source=head.source)
        for line in lines[1:]:  # as _read takes them: frames and the source lines under them
            text = line.text
            fm = _FRAME.match(text) if text[:1].isspace() and 'File "' in text else None
            if fm:
                made.add_frame(line, fm.group("file"))
            elif made.frames and text.strip().strip("^~ "):
                made.code = line
        self._open[key] = made
        return made

    def feed(self, line: LogLine) -> None:
        # a line that changed nothing before changes nothing now while no traceback of its rank is
        # open, no summary is being read and no header awaits its message: the checks below, all
        # on the text alone, would end at the same `text in self._inert` (a warning every step)
        if (line.text in self._inert and not self._in_summary and not self._detail_for
                and (line.source, line.rank) not in self._open):
            return
        self._read(line)

    def _read(self, line: LogLine) -> None:
        """feed() past its first test (feed_block makes that test itself)."""
        text = line.text
        key = (line.source, line.rank)
        stripped = text.strip()
        if self._detail_for:
            self._take_detail(key, line, stripped)
        if stripped[:1] in _MARK_HEADS:  # each of the three marks below starts with one of these
            if stripped.startswith("Exception ignored in"):  # UNRAISABLE, without a regex call per line
                self._unraisable_until[key] = line.no + UNRAISABLE_WINDOW
                return
            if stripped.startswith(_CHAIN_MARKS) and len(self._chain_marks) < MAX_CHAIN_MARKS:
                self._chain_marks.append((line.source, line.rank, line.no, stripped.startswith(_CHAIN_MARKS[0])))
                return
            if stripped.startswith("Traceback (most recent call last)"):
                self._open[key] = Traceback(line.rank, line.no, source=line.source)
                if len(self._open) > MAX_OPEN_TRACEBACKS:
                    self._open.popitem(last=False)  # the oldest: a rank that never finished it
                return
        tb = self._open.get(key)
        if tb is not None and type(tb) is not Traceback:
            tb = self._traceback(key)
        if tb is None and not self._in_summary and text in self._inert:
            return
        if tb is not None:
            fm = _FRAME.match(text) if text[:1].isspace() and 'File "' in text else None  # _FRAME starts with \s+
            if fm:
                tb.add_frame(line, fm.group("file"))
                return
            # an open traceback has no exception yet: it is closed when its exception line comes
            if text[:1].isspace() and not (tb.frames and len(text) - len(text.lstrip()) < tb.indent
                                           and EXCEPTION_LINE.match(stripped)):
                if tb.frames and stripped.strip("^~ "):  # not Python 3.11's carets under the statement
                    tb.code = line
                return  # a source line under a frame, or C++ frames (an exception indented less than
                # the frames is the traceback's own: torchrun's summary prints an error_file's so)
            if tb.wrapped is not None:  # rich wrapped a long frame line: '/a/b/config.py:' then '869 in fn'
                head, tb.wrapped = tb.wrapped, None
                m = RICH_FRAME.fullmatch(head.text + stripped)
                if m:
                    frame = LogLine(head.no, f'  File "{m.group("file")}", line {m.group("line")}, in {m.group("func")}',
                                    head.rank, head.source)
                    tb.files.append(m.group("file"))
                    tb.frames.append(frame)
                    return
            if stripped[:1] in "/~.<" and RICH_PATH_PART.fullmatch(stripped):
                tb.wrapped = LogLine(line.no, stripped, line.rank, line.source)
                return
            em = EXCEPTION_LINE.match(stripped)
            if em:
                tb.exception = line
                tb.exc_type = em.group("type")
                del self._open[key]
                self._exception_event(line, tb)
                return
            if not stripped.startswith(("During handling", "The above exception")):
                # a line of another stream broke in; keep the traceback open a while
                if line.no - tb.start > 400:
                    del self._open[key]
        # torchrun's ChildFailedError summary
        if _ROOT_CAUSE_HEADER.search(text):
            self._in_summary = True
            self._summary_rank = None
            return
        if self._in_summary:
            m = _SUMMARY_RANK.match(text)
            if m:
                self._summary_rank = int(m.group(1))
                if self.failed_rank is None or self._failed_rank_is_local:
                    self.failed_rank = self._summary_rank
                    self._failed_rank_is_local = False
                return
            m = _SUMMARY_EXIT.match(text)
            if m:
                code = int(m.group(1))
                self.summary_exit = code
                self.exit_codes.append(code)
                self.events.append(FailureEvent("exit", line, primary=False, exit_code=code))
                self._in_summary = False
                return
        m = _LAUNCHER_FAILED.search(text)
        if m:
            code = int(m.group(1))
            self.exit_codes.append(code)
            if self.failed_rank is None and line.rank is None:
                self.failed_rank = int(m.group(2))
                self._failed_rank_is_local = True
            self.events.append(FailureEvent("exit", line, primary=False, exit_code=code))
            return
        m = _DS_LAUNCHER_EXIT.search(text)
        if m and m.group(1) != "0":
            code = int(m.group(1))
            self.exit_codes.append(code)
            self.events.append(FailureEvent("exit", line, primary=False, exit_code=code))
            return
        if (SECONDARY_LINES.search(text) or (stripped[:6] == "frame " and _CPP_FRAME.match(stripped))
                or (stripped[:1] in "[W" and _GLOG_WARNING.match(stripped))
                or ("Warning: " in stripped and _PY_WARNING.match(stripped))):
            self._inert.add(text)
            return
        for kind, pattern in PRIMARY_LINES:
            if pattern.search(stripped):
                self.events.append(FailureEvent(kind, line, primary=True))
                return
        if NCCL_WARN.search(stripped) and not BENIGN_NCCL_WARN.search(stripped):
            self.nccl_warnings.append(line)
            return
        em = EXCEPTION_LINE.match(stripped)
        if em and em.group("msg") is not None and not stripped.startswith(("Exception ignored", "Warning")):
            # an exception echoed without its traceback ('[rank3]: AssertionError: ...')
            self._exception_event(line, None)
            return
        if logged_error(stripped):
            self.logged.append(FailureEvent("logged", line, primary=True))
            return
        m = _NONZERO_EXIT.search(text)
        if m:
            self.events.append(FailureEvent("exit", line, primary=False, exit_code=int(m.group(1))))
        else:
            self._inert.add(text)

    def _exception_event(self, line: LogLine, tb: Traceback | None) -> None:
        stripped = line.text.strip()
        until = self._unraisable_until.get((line.source, line.rank))
        if until is not None and line.no <= until:
            del self._unraisable_until[(line.source, line.rank)]
            return  # raised in a destructor at interpreter exit: printed, ignored, not a failure
        wrapper = bool(WRAPPER_EXCEPTIONS.search(stripped))
        # llamafactory-cli's own traceback only reports that torchrun, its child, failed
        if tb is not None and tb.exc_type.endswith("CalledProcessError") and tb.files and tb.files[0].endswith(("llamafactory-cli", "/cli.py")):
            wrapper = True
        # the parent of torch.multiprocessing.spawn re-raising what a worker raised: the worker's own
        # traceback follows ('-- Process 2 terminated with the following error:')
        if tb is not None and tb.files and tb.files[-1].endswith(_SPAWN_FILE) and tb.exc_type in ("Exception", "ProcessRaisedException"):
            wrapper = True
        event = FailureEvent("exception", line, primary=not wrapper, traceback=tb)
        self.events.append(event)
        if wrapper:
            return
        if tb is not None and tb.code is not None and tb.exc_type.endswith("AssertionError"):
            event.detail.append(tb.code)  # what was asserted: 'assert len(set(t.dtype ...)) == 1', then a bare AssertionError
        if _is_header(stripped) and EXCEPTION_LINE.match(stripped):
            self._detail_for[(line.source, line.rank)] = event  # 'Error(s) in loading state_dict for X:': the message follows

    def _take_detail(self, key: tuple[int, int | None], line: LogLine, stripped: str) -> None:
        """A line right under a header exception ('...:') is its message, up to DETAIL_LINES of them."""
        event = self._detail_for.get(key)
        if event is None:
            return
        last = event.detail[-1].no if event.detail else event.line.no
        # the rank's next line: right under it, or (ranks printing at once, '[rankN]:' lines) a few lines on
        near = line.no == last + 1 or (key[1] is not None and line.no - last <= DETAIL_RANK_GAP)
        if (not near or not stripped or stripped.startswith(("Traceback", 'File "', "During handling", "The above exception"))
                or EXCEPTION_LINE.match(stripped) or SECONDARY_LINES.search(stripped) or _LAUNCHER_FAILED.search(stripped)):
            del self._detail_for[key]
            return
        event.detail.append(line)
        if len(event.detail) >= DETAIL_LINES:
            del self._detail_for[key]

    def finish(self) -> FailureAnalysis:
        primaries = [e for e in self.events if e.primary]
        others = [e for e in primaries if not _HEARTBEAT_ABORT.search(e.line.text)]
        primaries = others or primaries  # a heartbeat abort is the failure only when nothing else is
        root = None
        consequences: list[FailureEvent] = []
        logged = self._logged_in_play(primaries)
        if primaries or logged:
            pool = self._pool(primaries, logged)
            echoes = _consequence_ids(pool)
            pool = _without_passing_logged(pool, echoes)
            root = self._choose_root(pool, echoes)
            if id(root) not in echoes:
                consequences = [e for e in pool if id(e) in echoes and e.line.no > root.line.no]
        else:
            root = self._exit_root()
        raised = self._raised_after(root) if root is not None and root.kind == "logged" else None
        if raised is not None:  # the rank logged its error, then raised it: one error, the traceback's frames
            root = FailureEvent("logged", root.line, True, traceback=raised.traceback)
        lines = _root_lines(root) | _root_lines(raised)
        chained = self._chained_after(root)
        for linked in chained:  # the exceptions it caused: one error, read as one
            lines |= _root_lines(linked)
        if chained and (_bare(root) or self._raised_from(root, chained[-1])):
            root = chained[-1]  # the exception the library raised to explain the first ('raise X from e')
        return FailureAnalysis(self.events, self._failed_rank(root, consequences),
                               self.exit_codes, root, lines, self.failed_rank, consequences, chained,
                               list(root.detail) if root is not None else [])

    def _logged_in_play(self, primaries: list[FailureEvent]) -> list[FailureEvent]:
        """The error-level log lines that may be the root: only when the run failed (a primary
        error, or a failing exit code), and not long before the first sign of that failure."""
        if not self.logged:
            return []
        marks = primaries or [e for e in self.events if e.kind == "exit" and e.exit_code not in (0, None)]
        if not marks:
            return []
        first = min(marks, key=lambda e: (e.line.source, e.line.no)).line
        return [e for e in self.logged if e.line.source == first.source and e.line.no >= first.no - LOGGED_WINDOW]

    def _chained_after(self, root: FailureEvent | None) -> list[FailureEvent]:
        """The exceptions Python printed as chained to the root's ('The above exception was the
        direct cause of the following exception:', 'During handling of the above exception, ...'):
        the later link often carries the library's explanation of the first."""
        if root is None or root.kind != "exception":
            return []
        out, last = [], root.line.no
        marks = self._marks_of(root)
        for e in self.events:
            if len(out) >= MAX_CHAIN_LINKS:
                break
            if (e.kind != "exception" or e.line.source != root.line.source or e.line.rank != root.line.rank
                    or e.line.no <= last or e.line.no - last > CHAIN_GAP_LINES):
                continue
            start = e.traceback.start if e.traceback is not None else e.line.no
            if not any(last < m[2] < start for m in marks):
                break
            out.append(e)
            last = e.line.no
        return out

    def _raised_from(self, first: FailureEvent, last: FailureEvent) -> bool:
        """Every link from first to last is 'The above exception was the direct cause of the
        following exception' (raise ... from ...), none an error while handling another."""
        marks = [m for m in self._marks_of(first) if first.line.no < m[2] < last.line.no]
        return bool(marks) and all(m[3] for m in marks)

    def _marks_of(self, event: FailureEvent) -> list[tuple[int, int | None, int, bool]]:
        """The chain marks printed in the event's log and rank."""
        return [m for m in self._chain_marks if m[0] == event.line.source and m[1] == event.line.rank]

    def _raised_after(self, root: FailureEvent) -> FailureEvent | None:
        """The exception the same rank raised right after logging its error."""
        line = root.line
        return next((e for e in self.events if e.kind == "exception" and e.primary and e.line.source == line.source
                     and e.line.rank == line.rank and 0 < e.line.no - line.no <= LOGGED_TRACEBACK_LINES), None)

    def _failed_rank(self, root: FailureEvent | None, consequences: list[FailureEvent]) -> int | None:
        """The rank whose own error is the root. torchrun names the rank that exited first, which
        is often the one whose watchdog fired, not the one that failed."""
        if root is None:
            return self.failed_rank
        if root.line.rank is not None and (self.failed_rank is None or consequences):
            return root.line.rank
        if consequences and self.failed_rank in {e.line.rank for e in consequences}:
            return None  # torchrun named a rank that only timed out; the failing rank's lines carry no prefix
        return self.failed_rank if self.failed_rank is not None else root.line.rank

    def _pool(self, primaries: list[FailureEvent], logged: list[FailureEvent]) -> list[FailureEvent]:
        """The primary errors of the first log that has one, with the NCCL WARN lines shortly before
        them and the error-level log lines in play."""
        if not primaries:
            return sorted(logged, key=lambda e: (e.line.source, e.line.no))
        source = primaries[0].line.source
        first = min(e.line.no for e in primaries if e.line.source == source)
        warns = [FailureEvent("nccl", w, primary=True) for w in self.nccl_warnings
                 if w.source == source and first - WARN_BEFORE_ERROR_LINES <= w.no <= first]
        logged = [e for e in logged if e.line.source == source]
        return sorted(warns + logged + primaries, key=lambda e: (e.line.source, e.line.no))

    def _choose_root(self, pool: list[FailureEvent], echoes: set[int]) -> FailureEvent:
        """The launcher's first failed rank's first error; but when that is a timeout or a lost
        peer, the own error some rank printed before it (or the launcher's exit code of the rank
        that died without one) is the root."""
        own = pool
        if self.failed_rank is not None:
            # drop the errors other ranks printed; rank-less lines (compiler, NCCL, shell) stay
            own = [e for e in pool if e.line.rank in (self.failed_rank, None)] or pool
        root = _first_meaningful(own)
        if id(root) not in echoes:
            return root
        earlier = [e for e in pool if id(e) not in echoes and (e.line.source, e.line.no) < (root.line.source, root.line.no)]
        if earlier:
            return _first_meaningful(earlier)
        died = self._summary_exit_event()
        if died is not None and root.line.rank is not None and root.line.rank != self.failed_rank:
            return died  # the rank torchrun saw fail first printed nothing: its exit code says how it died
        return root

    def _summary_exit_event(self) -> FailureEvent | None:
        if self.summary_exit in (None, 0, -15):
            return None
        return next((e for e in self.events if e.kind == "exit" and e.exit_code == self.summary_exit), None)

    def _exit_root(self) -> FailureEvent | None:
        """No error of the rank's own: the exit code is all we have (e.g. -9 from the OOM killer)."""
        failing_exits = [e for e in self.events if e.kind == "exit" and e.exit_code not in (0, None)]
        stopped = self._launcher_signal()
        if stopped is not None and all(e.exit_code in FORWARDED_EXITS for e in failing_exits):
            return stopped  # the launcher was stopped from outside: the workers' -15 only echo it
        if not failing_exits:
            return None
        summary = [e for e in failing_exits if e.exit_code == self.summary_exit]
        return (summary or failing_exits)[0]

    def _launcher_signal(self) -> FailureEvent | None:
        """torchrun's own 'SignalException: Process N got signal: 15' (its traceback read as any
        other), as a signal event: the launcher got a signal and took the workers down with it."""
        for e in self.events:
            if e.kind == "exception" and not e.primary and _SIGNAL_EXCEPTION.search(e.line.text):
                return FailureEvent("signal", e.line, True, traceback=e.traceback)
        return None


def _without_passing_logged(pool: list[FailureEvent], echoes: set[int]) -> list[FailureEvent]:
    """The pool without the logged errors that the run survived: one that the same rank followed
    with a real error (an exception, a CUDA or NCCL error) only after LOGGED_TRACEBACK_LINES was
    logged and passed (a deprecated DeepSpeed option); the real error after it is the failure."""
    keep = []
    for i, e in enumerate(pool):
        if e.kind == "logged":
            later = next((f for f in pool[i + 1:] if f.kind != "logged" and id(f) not in echoes
                          and f.line.source == e.line.source and f.line.rank == e.line.rank), None)
            if later is not None and later.line.no - e.line.no > LOGGED_TRACEBACK_LINES:
                continue
        keep.append(e)
    return keep


def _consequence_ids(pool: list[FailureEvent]) -> set[int]:
    """The events that echo another failure: timeouts, lost peers, and a rank's abort after them."""
    echoes: set[int] = set()
    echoed: set[tuple[int, int | None]] = set()
    for e in pool:
        text = e.line.text
        if is_consequence(text) or ((e.line.source, e.line.rank) in echoed and _ABORT_AFTER.search(text.strip())):
            echoes.add(id(e))
            echoed.add((e.line.source, e.line.rank))
    return echoes


def _event_key(event: FailureEvent) -> tuple:
    return (event.line.source, event.line.rank, event.kind, event.primary)


def _bare(event: FailureEvent) -> bool:
    """An exception printed with its type only ('StopIteration', 'KeyError'): no message to show."""
    m = EXCEPTION_LINE.match(event.line.text.strip())
    return bool(m) and not (m.group("msg") or "").strip()


def _root_lines(root: FailureEvent | None) -> set[tuple[int, int]]:
    root_lines: set[tuple[int, int]] = set()
    if root is not None:
        root_lines.add((root.line.source, root.line.no))
        root_lines.update((ln.source, ln.no) for ln in root.detail)  # the lines carrying its message
        tb = root.traceback
        if tb is not None:
            root_lines.update((tb.source, f.no) for f in tb.frames)
            root_lines.add((tb.source, tb.start))
    return root_lines


BUILD_OUTPUT_LINES = 60  # how far after ninja's 'FAILED: target' the compiler's own message may come


def _first_meaningful(events: list[FailureEvent]) -> FailureEvent:
    """The earliest primary error, preferring a real error over a user's Ctrl-C, and the
    compiler's diagnostic over ninja's 'FAILED: <target>' line that announces it."""
    for i, e in enumerate(events):
        if e.kind == "exception" and e.line.text.strip().startswith("KeyboardInterrupt"):
            continue
        if e.kind == "compiler" and e.line.text.lstrip().startswith("FAILED: "):
            follow = next((f for f in events[i + 1:] if f.kind == "compiler" and f.line.source == e.line.source
                           and f.line.no - e.line.no <= BUILD_OUTPUT_LINES
                           and not f.line.text.lstrip().startswith(("FAILED: ", "ninja: "))), None)
            if follow is not None:
                return follow
        return e
    return events[0]


def analyse(lines: Iterable[LogLine]) -> FailureAnalysis:
    reader = FailureReader()
    for line in lines:
        reader.feed(line)
    return reader.finish()
