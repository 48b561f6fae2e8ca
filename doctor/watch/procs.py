"""Which processes of the run are its ranks. A Python rank registers itself (procs/<pid>.json,
written by rankside/sitecustomize.py); any other process carrying the run's token with a
LOCAL_RANK its parent did not have counts too (a rank that py-spy can still read)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..launch.processes import processes_with_token


@dataclass
class Proc:
    pid: int
    rank: int | None
    local_rank: int | None
    role: str  # "rank", "top" (the doctor's direct child), "unregistered"
    world_size: int | None = None
    signal: int = 0
    stack_file: str | None = None
    fifo: str | None = None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"


def _int(text) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def read_environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state (R, S, D, Z...), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X")


def registrations(procs_dir: Path) -> list[Proc]:
    """Every process that registered itself, alive or not (a rank that died is a finding)."""
    out = []
    for path in sorted(procs_dir.glob("*.json")):
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        out.append(Proc(pid=int(d["pid"]), rank=_int(d.get("rank")) if d.get("rank") else _int(d.get("local_rank")),
                        local_rank=_int(d.get("local_rank")), role=d.get("role", "rank"),
                        world_size=_int(d.get("world_size")), signal=int(d.get("signal") or 0),
                        stack_file=d.get("stack_file"), fifo=d.get("fifo")))
    return out


def unregistered_ranks(token: str, token_var: str, known: set[int]) -> list[Proc]:
    """Token processes with a LOCAL_RANK of their own that never registered (not Python, or a
    launcher that dropped PYTHONPATH)."""
    out = []
    for pid in processes_with_token(token, token_var):
        if pid in known:
            continue
        env = read_environ(pid) or {}
        if "LOCAL_RANK" not in env:
            continue
        parent = read_environ(parent_pid(pid) or -1) or {}
        if (parent.get("RANK"), parent.get("LOCAL_RANK")) == (env.get("RANK"), env.get("LOCAL_RANK")):
            continue  # a data-loader worker or a tool the rank started
        out.append(Proc(pid=pid, rank=_int(env.get("RANK", env.get("LOCAL_RANK"))),
                        local_rank=_int(env.get("LOCAL_RANK")), role="unregistered",
                        world_size=_int(env.get("WORLD_SIZE"))))
    return out


def run_processes(procs_dir: Path, token: str, token_var: str) -> list[Proc]:
    """The ranks (registered or not) and the top process, sorted by rank; the dead included."""
    regs = registrations(procs_dir)
    found = regs + unregistered_ranks(token, token_var, {p.pid for p in regs})
    return sorted(found, key=lambda p: (p.role == "top", p.rank if p.rank is not None else 1 << 30, p.pid))
