"""Reading PyTorch's Flight Recorder dumps (torch 2.5+; format version 2.x): the JSON the rank
side writes with torch's _dump_fr_trace_json / _dump_nccl_trace_json (fr/rank<R>.<kind>.json),
and the pickle ProcessGroupNCCL writes itself on a watchdog time-out or a pipe request
(<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>). Each gives, per process group, the last collective
enqueued and completed; a rank with enqueued > completed waits in the oldest uncompleted one."""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Op:
    pg: str  # process group id ("0" is the default group)
    pg_name: str
    seq: int  # collective_seq_id
    name: str  # profiling_name, e.g. "nccl:all_reduce", "gloo:barrier"
    state: str = ""
    sizes: str = ""

    def describe(self) -> str:
        where = "" if self.pg in ("0", "") else f" in group {self.pg_name or self.pg}"
        return f"{self.name} #{self.seq}{where}"


@dataclass
class RankTrace:
    rank: int
    sources: list[str] = field(default_factory=list)
    enqueued: dict[str, int] = field(default_factory=dict)  # pg -> last enqueued collective seq
    completed: dict[str, int] = field(default_factory=dict)
    ops: dict[tuple[str, int], Op] = field(default_factory=dict)  # (pg, seq) -> op

    def pending(self) -> list[Op]:
        """The collectives this rank entered and has not finished, oldest first."""
        out = []
        for pg, last in self.enqueued.items():
            done = self.completed.get(pg, -1)
            for seq in range(max(done + 1, last - 50), last + 1):
                op = self.ops.get((pg, seq))
                if op is not None:
                    out.append(op)
                elif seq == done + 1:
                    out.append(Op(pg, "", seq, "a collective"))
        return sorted(out, key=lambda o: (o.pg != "0", o.seq))

    def last_seq(self, pg: str) -> int:
        return self.enqueued.get(pg, 0)


class _PlainUnpickler(pickle.Unpickler):
    """Flight Recorder pickles hold only dicts, lists and scalars: refuse anything else."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a Flight Recorder dump")


def load_dump(path: Path) -> dict | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        if raw[:1] in (b"{", b" ", b"\n"):
            return json.loads(raw.decode("utf-8", "replace"))
        return _PlainUnpickler(io.BytesIO(raw)).load()
    except Exception:
        return None


def _int(value, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def merge_dump(trace: RankTrace, dump: dict, source: str) -> None:
    """Add one dump's pg_status and collective entries to a rank's trace (the newest wins)."""
    if not isinstance(dump, dict):
        return
    trace.sources.append(source)
    for pg, status in (dump.get("pg_status") or {}).items():
        if not isinstance(status, dict):
            continue
        pg = str(pg)
        trace.enqueued[pg] = max(trace.enqueued.get(pg, -1), _int(status.get("last_enqueued_collective")))
        trace.completed[pg] = max(trace.completed.get(pg, -1), _int(status.get("last_completed_collective")))
    for e in dump.get("entries") or []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        group = e.get("process_group") or ("", "")
        pg = str(e.get("pg_id", group[0] if group else ""))
        seq = _int(e.get("collective_seq_id"))
        op = Op(pg, str(group[1]) if len(group) > 1 else "", seq, str(e.get("profiling_name", "?")),
                str(e.get("state", "")), str(e.get("input_sizes", "")))
        trace.ops[(pg, seq)] = op
        if (pg not in trace.enqueued) and not dump.get("pg_status"):
            trace.enqueued[pg] = max(trace.enqueued.get(pg, -1), seq)
        if e.get("state") == "completed" and not dump.get("pg_status"):
            trace.completed[pg] = max(trace.completed.get(pg, -1), seq)


def read_traces(fr_dir: Path, prefixes: list[str], ranks: list[int], newer_than: float = 0.0) -> dict[int, RankTrace]:
    """Every rank's Flight Recorder state from the dumps written after newer_than (epoch s):
    the rank side's JSON, and torch's own dumps at each of prefixes (+ the rank number)."""
    out: dict[int, RankTrace] = {}
    for rank in ranks:
        paths = [fr_dir / f"rank{rank}.fr.json", fr_dir / f"rank{rank}.nccl.json"]
        paths += [Path(f"{p}{rank}") for p in dict.fromkeys(prefixes) if p]
        trace = RankTrace(rank)
        for path in paths:
            try:
                if path.stat().st_mtime < newer_than:
                    continue
            except OSError:
                continue
            dump = load_dump(path)
            if dump is not None:
                merge_dump(trace, dump, str(path))
        if trace.sources:
            out[rank] = trace
    return out
