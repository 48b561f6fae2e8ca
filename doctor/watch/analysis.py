"""Who is where when the run stalls: for each rank the collective it waits in (by sequence
number when the Flight Recorder has it) or its top frame; the ranks that are not in the
collective the others wait in; and the catalog entry (MGD30x) whose pattern this is."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from ..catalog import find_entry
from .dump import RankDump
from .procs import Proc, process_state
from .stacks import (Frame, collective_frame, main_thread, mentions, parse_faulthandler, parse_py_spy,
                     top_frame, users_frame)
from .traces import Op, RankTrace

PREPROCESS = re.compile(r"datasets/(arrow_dataset|builder|load|iterable_dataset)\.py|/tokenizers/|tokenization_utils|"
                        r"llamafactory/data/|\w*(preprocess|tokeniz)\w*", re.I)
MAIN_FIRST = re.compile(r"main_process_first")
SAVE = re.compile(r"\b(save_pretrained|save_model|_save_checkpoint|_save|save_state|save_checkpoint|"
                  r"save_16bit_model|save_file)\b|torch/serialization\.py|safetensors/")
GENERATE = re.compile(r"generation/utils\.py")
ZERO3 = re.compile(r"partitioned_param_coordinator|parameter_offload\.py|partition_parameters\.py")
JIT_LOCK = re.compile(r"torch/utils/file_baton\.py")
RENDEZVOUS = re.compile(r"torch/distributed/elastic/rendezvous|torch/distributed/rendezvous\.py|"
                        r"_store_based_barrier|_create_c10d_store|\bTCPStore\b")
SLOW_HINT = ("If that rank is only slow and would arrive, rerun with a larger --stall (or --keep-running); "
             "otherwise the collective's own timeout (ddp_timeout, 30 min by default) ends the run later.")


@dataclass
class RankState:
    proc: Proc
    alive: bool
    frames: list[Frame] = field(default_factory=list)  # the main thread's, innermost first
    waiting: Op | None = None
    called_from: Frame | None = None
    top: Frame | None = None
    users: Frame | None = None
    trace: RankTrace | None = None
    answered: bool = False
    kernel_state: str | None = None

    @property
    def rank(self) -> int | None:
        return self.proc.rank

    def where(self) -> str:
        if self.top is None:
            return "no stack (it did not answer the dump signal)"
        text = self.top.short()
        if self.users is not None and self.users != self.top:
            text += f", from {self.users.short()}"
        return text


@dataclass
class Finding:
    pattern: str
    summary: str
    target: Op | None = None
    outliers: list[int] = field(default_factory=list)
    code: str | None = None
    title: str = ""
    fix: str | None = None
    hint: str | None = None


def rank_state(dump: RankDump | None, proc: Proc, trace: RankTrace | None) -> RankState:
    """One rank's state from its stack dump(s) and Flight Recorder trace."""
    state = process_state(proc.pid)
    s = RankState(proc, alive=state not in (None, "Z", "X"), trace=trace, kernel_state=state)
    if dump is not None:
        threads = parse_faulthandler(dump.stack_text) or parse_py_spy(dump.py_spy_text)
        main = main_thread(threads)
        s.frames = main.frames if main else []
        s.answered = dump.answered
    s.top, s.users = top_frame(s.frames), users_frame(s.frames)
    pending = trace.pending() if trace else []
    in_call = collective_frame(s.frames)
    if pending:
        s.waiting = pending[0]
    elif in_call:
        s.waiting = Op("", "", -1, in_call[0].func)
    if in_call:
        s.called_from = in_call[1]
    return s


def _same(a: Op, b: Op) -> bool:
    if a.seq >= 0 and b.seq >= 0:
        return (a.pg, a.seq) == (b.pg, b.seq)
    return a.name.split(":")[-1] == b.name.split(":")[-1]


def _target(waiting: list[RankState]) -> Op:
    """The collective most waiting ranks are in (the one with a sequence number preferred)."""
    keys = Counter((w.waiting.pg, w.waiting.seq, w.waiting.name.split(":")[-1]) for w in waiting)
    (pg, seq, _), _ = keys.most_common(1)[0]
    return next(w.waiting for w in waiting if (w.waiting.pg, w.waiting.seq) == (pg, seq))


def _any(states: list[RankState], pattern: re.Pattern) -> bool:
    return any(mentions(s.frames, pattern) for s in states)


def analyse(states: list[RankState]) -> Finding:
    ranks = [s for s in states if s.proc.role != "top"]
    if not ranks:
        return _no_ranks(states)
    waiting = [s for s in ranks if s.alive and s.waiting is not None]
    if not waiting:
        return _nobody_waits(ranks)
    target = _target(waiting)
    dead = [s for s in ranks if not s.alive]
    away = [s for s in ranks if s.alive and (s.waiting is None or not _same(s.waiting, target))]
    elsewhere = [s for s in away if s.waiting is None]
    different = [s for s in away if s.waiting is not None]
    f = _pattern(ranks, waiting, target, dead, elsewhere, different)
    f.target, f.outliers = target, [s.rank for s in dead + away if s.rank is not None]
    return _with_catalog(f)


def _pattern(ranks, waiting, target, dead, elsewhere, different) -> Finding:
    where = f"{target.describe()} that {_names(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in"
    if dead:
        return Finding("dead-peer", f"{_names(dead)} exited while {where}: the collective can never complete.")
    if _any(ranks, GENERATE) and _any(ranks, ZERO3):
        return Finding("zero3-generate", f"{_names(elsewhere + different) or 'No rank'} left generate() while "
                                         f"{where} (ZeRO-3 parameter gathering).")
    if different:
        lines = "; ".join(f"{_names([s])} is in {s.waiting.describe()}" for s in different)
        return Finding("mismatched", f"The ranks are in different collectives: {lines}, while {where}. "
                                     "They called collectives in a different order or number (uneven batches, "
                                     "a collective under `if rank == 0`).")
    if not elsewhere:
        return Finding("all-arrived", f"Every rank is in {target.describe()} and it does not complete: "
                                      "the data does not move between the ranks.")
    lines = "; ".join(f"{_names([s])} is in {s.where()}" for s in elsewhere)
    summary = f"{_names(elsewhere)} {'is' if len(elsewhere) == 1 else 'are'} not in {where}: {lines}."
    if _any(elsewhere, PREPROCESS) or _any(waiting, MAIN_FIRST):
        return Finding("rank0-preprocessing", summary, hint=SLOW_HINT)
    if _any(elsewhere, SAVE):
        return Finding("main-only-save", summary + " A save (or evaluation) that only the main process "
                       "runs keeps the others waiting; any collective inside it (ZeRO-3's weight gather) "
                       "deadlocks.", hint=SLOW_HINT)
    return Finding("rank-elsewhere", summary, hint=SLOW_HINT)


def _nobody_waits(ranks: list[RankState]) -> Finding:
    lines = "; ".join(f"{_names([s])} is in {s.where()}" for s in ranks)
    if _any(ranks, JIT_LOCK):
        f = Finding("jit-lock", f"No rank is in a collective; they wait for a DeepSpeed op build lock: {lines}.")
    elif _any(ranks, RENDEZVOUS):
        f = Finding("rendezvous", f"The ranks are still joining the process group: {lines}.")
    elif all(mentions(s.frames, PREPROCESS) for s in ranks if s.frames):
        f = Finding("all-preprocessing", f"Every rank is preprocessing the data: {lines}.", hint=SLOW_HINT)
    else:
        f = Finding("no-collective", f"No rank is in a collective; each is in its own code: {lines}.",
                    hint=SLOW_HINT)
    return _with_catalog(f)


def _no_ranks(states: list[RankState]) -> Finding:
    if not states:
        return Finding("no-ranks", "No process of the run answered (none is a Python rank the doctor could reach).")
    lines = "; ".join(f"pid {s.proc.pid} is in {s.where()}" for s in states)
    f = _nobody_waits(states)
    f.pattern, f.summary = "single-process" if f.code is None else f.pattern, f"No rank processes; {lines}."
    return f


# pattern -> (catalog code, the fix to show first, by its words)
CATALOG = {
    "dead-peer": ("MGD301", r"did not arrive|earlier error"),
    "zero3-generate": ("MGD303", r"synced_gpus=True"),
    "mismatched": ("MGD301", r"mismatched collectives"),
    "all-arrived": ("MGD304", r"P2P off|NCCL_P2P_DISABLE"),
    "rank0-preprocessing": ("MGD302", r"Raise the timeout|tokenized_path"),
    "main-only-save": ("MGD301", r"legitimately slower|raise the timeout"),
    "rank-elsewhere": ("MGD301", r"did not arrive"),
    "jit-lock": ("MGD305", r"lock"),
    "rendezvous": ("MGD306", r"did not join"),
    "all-preprocessing": ("MGD302", r"tokenized_path|preprocessing_num_workers"),
}


def _with_catalog(f: Finding) -> Finding:
    if f.pattern not in CATALOG:
        return f
    code, words = CATALOG[f.pattern]
    entry = find_entry(code)
    if entry is None:
        return f
    fixes = [x.text for x in entry.fixes]
    f.code, f.title = code, entry.title
    f.fix = next((t for t in fixes if re.search(words, t, re.I)), fixes[0] if fixes else None)
    return f


def _names(states: list[RankState]) -> str:
    ranks = sorted(s.rank for s in states if s.rank is not None)
    others = [f"pid {s.proc.pid}" for s in states if s.rank is None]
    words = [str(r) for r in ranks]
    text = ""
    if words:
        text = ("rank " if len(words) == 1 else "ranks ") + (", ".join(words[:-1]) + " and " + words[-1]
                                                            if len(words) > 1 else words[0])
    return ", ".join([t for t in [text] if t] + others)
