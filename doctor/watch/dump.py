"""Asking the run's ranks where they are, without stopping them: the dump signal (faulthandler
writes every thread's stack), a line on each rank's FIFO (its watch thread writes the Flight
Recorder trace), a write to ProcessGroupNCCL's own dump pipe, and py-spy when it is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .procs import Proc, alive

STACK_WAIT_S = 3.0
TRACE_WAIT_S = 3.0
PY_SPY_TIMEOUT_S = 20.0


@dataclass
class RankDump:
    proc: Proc
    stack_text: str = ""  # faulthandler's dump (this request's part of the file)
    py_spy_text: str = ""
    py_spy_file: str | None = None
    answered: bool = False


def _size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def _poke_fifo(path: str | None) -> None:
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, b"dump\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def _poke_nccl_pipe(pipe_prefix: str | None, rank: int | None) -> None:
    """ProcessGroupNCCL's monitor thread dumps its trace when its pipe is written to."""
    if not pipe_prefix or rank is None:
        return
    path = f"{pipe_prefix}{rank}.pipe"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no such pipe (not NCCL, or torch < 2.2) or no reader
        return
    try:
        os.write(fd, b"1")
    except OSError:
        pass
    finally:
        os.close(fd)


def _start_py_spy(proc: Proc, out_dir: Path) -> tuple[subprocess.Popen, Path] | None:
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    path = out_dir / f"rank{proc.rank if proc.rank is not None else 'x'}-{proc.pid}.py-spy.txt"
    try:
        with open(path, "wb") as out:
            return subprocess.Popen([exe, "dump", "--pid", str(proc.pid)], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), path
    except OSError:
        return None


def request_dumps(procs: list[Proc], stacks_dir: Path, pipe_prefix: str | None,
                  wait: Callable[[float], None]) -> list[RankDump]:
    """Signal every live process of the list and collect what each wrote. wait(s) keeps the
    output flowing while we wait."""
    dumps = [RankDump(p) for p in procs if alive(p.pid)]
    before = {d.proc.pid: _size(d.proc.stack_file) for d in dumps}
    spies = {}
    for d in dumps:
        p = d.proc
        if p.signal and p.stack_file:
            try:
                os.kill(p.pid, p.signal)
            except OSError:
                pass
        _poke_fifo(p.fifo)
        if p.role == "rank":
            _poke_nccl_pipe(pipe_prefix, p.rank)
        spy = _start_py_spy(p, stacks_dir)
        if spy:
            spies[p.pid] = spy
    _collect_stacks(dumps, before, wait)
    _collect_py_spy(dumps, spies, wait)
    return dumps


def _collect_stacks(dumps: list[RankDump], before: dict[int, int], wait) -> None:
    deadline = time.monotonic() + STACK_WAIT_S
    pending = [d for d in dumps if d.proc.signal and d.proc.stack_file]
    sizes = {}
    while pending and time.monotonic() < deadline:
        wait(0.1)
        for d in list(pending):
            size = _size(d.proc.stack_file)
            if size > before[d.proc.pid] and sizes.get(d.proc.pid) == size:  # grown, then stable
                pending.remove(d)
            sizes[d.proc.pid] = size
    for d in dumps:
        if not d.proc.stack_file:
            continue
        try:
            with open(d.proc.stack_file, "rb") as f:
                f.seek(before[d.proc.pid])
                d.stack_text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        d.answered = bool(d.stack_text.strip())


def _collect_py_spy(dumps: list[RankDump], spies: dict, wait) -> None:
    deadline = time.monotonic() + PY_SPY_TIMEOUT_S
    while any(p.poll() is None for p, _ in spies.values()) and time.monotonic() < deadline:
        wait(0.1)
    for d in dumps:
        spy = spies.get(d.proc.pid)
        if spy is None:
            continue
        proc, path = spy
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        try:
            d.py_spy_text = path.read_text(encoding="utf-8", errors="replace")
            d.py_spy_file = str(path)
        except OSError:
            pass
        d.answered = d.answered or "Thread " in d.py_spy_text


def wait_for_traces(fr_dir: Path, ranks: list[int], since: float, wait) -> None:
    """Until every rank's watch thread marked its Flight Recorder dump done (or TRACE_WAIT_S)."""
    deadline = time.monotonic() + TRACE_WAIT_S
    while time.monotonic() < deadline:
        done = 0
        for r in ranks:
            try:
                done += (fr_dir / f"rank{r}.done").stat().st_mtime >= since - 0.5
            except OSError:
                pass
        if done >= len(ranks):
            return
        wait(0.1)
