"""How the doctor's process ends, whatever happens around it: Ctrl-C and SIGTERM end as one line
and exit 130 / 143 (every launch kills its process tree on the way out: doctor/launch), and the
standard streams cannot turn a verdict into a traceback: a closed or full stdout (`| head -1`,
`>/dev/full`, `>&-`) keeps the verdict's exit code, an encoding that cannot show a character
shows '?', a closed stdin is bad input (exit 2) for the command that reads it."""

from __future__ import annotations

import io
import os
import signal
import sys
from typing import Callable

from ..errors import InputError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the doctor is, so it takes the path Ctrl-C takes."""


def _raise_terminated(signum, frame):
    raise Terminated()


def catch_signals() -> Callable[[], None]:
    """SIGINT raises KeyboardInterrupt, SIGTERM raises Terminated (a signal the parent set to be
    ignored stays ignored). Returns the function that puts the previous handlers back; outside
    the main thread nothing changes (Python delivers signals there only)."""
    wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: _raise_terminated}
    previous = {}
    try:
        for sig, handler in wanted.items():
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread
        return lambda: None

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    return restore


def interrupted(exc: KeyboardInterrupt) -> int:
    """The one line and the exit code of an interrupted doctor; further signals are ignored from
    here on (the doctor is ending, a second Ctrl-C must not print a traceback)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:
            break
    terminated = isinstance(exc, Terminated)
    _say("terminated" if terminated else "interrupted")
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


def _say(word: str) -> None:
    try:
        sys.stderr.write(f"mgft-doctor: {word}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


class SafeOutput:
    """Stands in for sys.stdout/sys.stderr: when the reader is gone (a closed pipe) or the disk is
    full, the output stops (the descriptor is pointed at /dev/null, so Python's own flush at exit
    succeeds as well) and the command goes on to its verdict's exit code."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except OSError:
                self._give_up()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except OSError:
                self._give_up()

    def _give_up(self) -> None:
        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no descriptor (a test's capture object): nothing to redirect
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _ClosedStdin(io.RawIOBase):
    """sys.stdin when descriptor 0 was closed at start (`<&-`): reading it is bad input."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        raise InputError("-: standard input is closed, there is nothing to read")


def guard_streams() -> Callable[[], None]:
    """Put the stand-ins in place; returns the function that flushes and puts the originals back."""
    saved = (sys.stdin, sys.stdout, sys.stderr)
    for fd in (0, 1, 2):
        _fill_if_closed(fd)
    if sys.stdin is None:
        sys.stdin = io.TextIOWrapper(io.BufferedReader(_ClosedStdin()))
    sys.stdout = SafeOutput(_replacing(sys.stdout, 1))
    sys.stderr = SafeOutput(sys.stderr if sys.stderr is not None else _replacing(None, 2))  # backslashreplace already

    def restore() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        sys.stdin, sys.stdout, sys.stderr = saved

    return restore


def _replacing(stream, fd: int):
    """stream with errors='replace' (an ASCII-only PYTHONIOENCODING shows '?'), or a writer on fd
    when Python found it closed at start."""
    if stream is None:
        return open(fd, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    if isinstance(stream, io.TextIOWrapper):
        try:
            stream.reconfigure(errors="replace")
        except (ValueError, OSError):
            pass
    return stream


def _fill_if_closed(fd: int) -> None:
    """A standard descriptor closed at start gets /dev/null, so no file the doctor opens later
    (a log, a pipe to a child) takes its number by accident."""
    try:
        os.fstat(fd)
        return
    except OSError:
        pass
    try:
        new = os.open(os.devnull, os.O_RDWR)
        if new != fd:
            os.dup2(new, fd)
            os.close(new)
    except OSError:
        pass
