"""One look at the whole run: its processes, every rank's stacks and Flight Recorder trace,
taken together so they describe the same moment; two looks tell a stall from a run that is
silent but still moving (a collective sequence number went on)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .analysis import Finding, RankState, analyse, rank_state
from .folder import TORCH_DEFAULT_TRACE_PREFIX
from .dump import RankDump, request_dumps, wait_for_traces
from .procs import Proc, alive, run_processes
from .traces import RankTrace, read_traces


@dataclass
class Snapshot:
    procs: list[Proc]
    dumps: dict[int, RankDump] = field(default_factory=dict)  # pid -> dump
    traces: dict[int, RankTrace] = field(default_factory=dict)  # rank -> trace

    def analyse(self) -> tuple[list[RankState], Finding]:
        states = [rank_state(self.dumps.get(p.pid), p, self.traces.get(p.rank) if p.role != "top" else None)
                  for p in self.procs]
        return states, analyse(states)


def current_processes(procs: list[Proc]) -> list[Proc]:
    """Drop the registrations of a rank that was restarted (a live process has its number now)."""
    live_ranks = {p.rank for p in procs if p.role != "top" and alive(p.pid)}
    return [p for p in procs if alive(p.pid) or p.role == "top" or p.rank not in live_ranks]


def take_snapshot(sup, reason: str) -> Snapshot:
    """Ask every live process of the run for its stacks and traces (sup: the Supervisor)."""
    folder = sup.folder
    procs = current_processes(run_processes(folder.sub("procs"), sup.token, _token_var()))
    since = time.time()
    dumps = request_dumps(procs, folder.sub("stacks"), sup.fr.get("pipe_prefix"), sup.wait)
    ranks = sorted({p.rank for p in procs if p.role == "rank" and p.rank is not None and alive(p.pid)})
    if ranks:
        wait_for_traces(folder.sub("fr"), ranks, since, sup.wait)
    prefixes = [sup.fr.get("trace_prefix"), TORCH_DEFAULT_TRACE_PREFIX]
    traces = read_traces(folder.sub("fr"), prefixes, ranks, newer_than=since - 0.5)
    return Snapshot(procs, {d.proc.pid: d for d in dumps}, traces)


def progressed(before: Snapshot, after: Snapshot) -> bool:
    """The run moved between the two looks: a rank's collectives went on, a process started or
    ended, or - while no rank waits in a collective - some main thread is in other functions
    (imports at start-up, a silent computation). A rank stuck waiting in the same collective
    means a stall, however busy the others look."""
    for rank, t in after.traces.items():
        old = before.traces.get(rank)
        if old is not None and (t.enqueued != old.enqueued or t.completed != old.completed):
            return True
    if {p.pid for p in before.procs if alive(p.pid)} != {p.pid for p in after.procs if alive(p.pid)}:
        return True
    states_before, _ = before.analyse()
    states_after, _ = after.analyse()
    if any(s.waiting is not None for s in states_after if s.proc.role != "top"):
        return False
    chains = {s.proc.pid: _chain(s) for s in states_before}
    return any(s.proc.pid in chains and _chain(s) != chains[s.proc.pid] for s in states_after)


def _chain(state: RankState) -> tuple:
    return tuple((f.file, f.func) for f in state.frames)


def _token_var() -> str:
    from ..launch.processes import TOKEN_VAR
    return TOKEN_VAR
