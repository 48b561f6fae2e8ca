"""Match salient log lines against the catalog and rank the entries by their evidence.

Each line is first reduced to the patterns whose literals it contains (cached per line shape,
digits collapsed, so a million progress lines cost one lookup each); only those run as regexes.
Scoring: a signature at the root error counts most, a signature elsewhere less, each required
context group and supporting context line adds, an exclusion removes the entry."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..catalog import Entry
from .lines import LogLine
from ..catalog.patterns import Pattern, collapse

KEEP_FIRST = 4
KEEP_LAST = 4
CACHE_LIMIT = 100_000
ROOT_SIGNATURE = 2.0
OTHER_SIGNATURE = 1.0
EXTRA_SIGNATURE = 0.2
REQUIRE_BONUS = 0.6
CONTEXT_BONUS = 0.3
CONTEXT_CAP = 3
MIN_SCORE = 0.9  # below this an entry is not offered as a diagnosis


@dataclass
class _Slot:
    entry: int
    role: str  # signature, require, context, exclude
    group: int
    pattern: Pattern


@dataclass
class Hits:
    """Where one pattern matched: the first and the latest few lines."""

    count: int = 0
    first: list[LogLine] = field(default_factory=list)
    last: list[LogLine] = field(default_factory=list)

    def add(self, line: LogLine) -> None:
        self.count += 1
        if len(self.first) < KEEP_FIRST:
            self.first.append(line)
        else:
            self.last.append(line)
            if len(self.last) > KEEP_LAST:
                self.last.pop(0)

    def lines(self) -> list[LogLine]:
        return self.first + self.last


@dataclass
class Candidate:
    entry: Entry
    score: float
    evidence: list[LogLine]
    at_root: bool
    rank: int | None


class Matcher:
    def __init__(self, entries: list[Entry]):
        self.entries = entries
        self.slots: list[_Slot] = []
        for ei, entry in enumerate(entries):
            for p in entry.signatures:
                self.slots.append(_Slot(ei, "signature", 0, p))
            for gi, group in enumerate(entry.requires):
                for p in group:
                    self.slots.append(_Slot(ei, "require", gi, p))
            for p in entry.context:
                self.slots.append(_Slot(ei, "context", 0, p))
            for p in entry.excludes:
                self.slots.append(_Slot(ei, "exclude", 0, p))
        self.hits: dict[int, Hits] = {}
        self._cache: dict[str, tuple[int, ...]] = {}

    def _candidates(self, text: str) -> tuple[int, ...]:
        key = collapse(text)
        found = self._cache.get(key)
        if found is None:
            found = tuple(i for i, s in enumerate(self.slots) if s.pattern.may_match(key))
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = found
        return found

    def feed(self, line: LogLine) -> None:
        text = line.text
        for i in self._candidates(text):
            if self.slots[i].pattern.search(text):
                hits = self.hits.get(i)
                if hits is None:
                    hits = self.hits[i] = Hits()
                hits.add(line)

    def rank(self, root_lines: set[tuple[int, int]], followers: set[tuple[int, int]] = frozenset(),
             root_rank: int | None = None, echo=None) -> list[Candidate]:
        """Rank the entries; a line is 'at the root' when it is the root error or its traceback,
        or follows it closely and was printed by the same rank (or by no rank in particular).
        echo(line) -> bool, given when the root is a rank's own error that other ranks' timeouts
        followed: an entry seen only on such echo lines would blame the consequence; it is dropped."""

        def at_root_line(ln: LogLine) -> bool:
            key = (ln.source, ln.no)
            if key in root_lines:
                return True
            return key in followers and ln.rank in (root_rank, None) and not (echo is not None and echo(ln.text))

        return self._rank(at_root_line, echo)

    def _rank(self, at_root_line, echo=None) -> list[Candidate]:
        by_entry: dict[int, list[tuple[_Slot, Hits]]] = {}
        for i, hits in self.hits.items():
            slot = self.slots[i]
            by_entry.setdefault(slot.entry, []).append((slot, hits))
        out = []
        for ei, matched in by_entry.items():
            entry = self.entries[ei]
            if any(s.role == "exclude" for s, _ in matched):
                continue
            sigs = [(s, h) for s, h in matched if s.role == "signature"]
            if not sigs:
                continue
            groups = {s.group for s, _ in matched if s.role == "require"}
            if len(groups) < len(entry.requires):
                continue
            at_root = any(at_root_line(ln) for _, h in sigs for ln in h.lines())
            if echo is not None and not at_root and all(echo(ln.text) for _, h in sigs for ln in h.lines()):
                continue
            distinct = len({id(s.pattern) for s, _ in sigs})
            contexts = len({id(s.pattern) for s, _ in matched if s.role == "context"})
            score = (ROOT_SIGNATURE if at_root else OTHER_SIGNATURE)
            score += EXTRA_SIGNATURE * min(distinct - 1, 2)
            score += REQUIRE_BONUS * len(entry.requires)
            score += CONTEXT_BONUS * min(contexts, CONTEXT_CAP)
            score += entry.priority
            if score < MIN_SCORE:
                continue
            evidence = _evidence(sigs, matched, at_root_line)
            rank = next((ln.rank for ln in evidence if at_root_line(ln) and ln.rank is not None), None)
            if rank is None:
                rank = next((ln.rank for ln in evidence if ln.rank is not None), None)
            out.append(Candidate(entry, score, evidence, at_root, rank))
        out.sort(key=lambda c: (-c.score, c.entry.code))
        return out


def _evidence(sigs, matched, at_root_line) -> list[LogLine]:
    """Signature lines first (root ones before others), then requirement and context lines."""
    seen: set[tuple[int, int, str]] = set()
    ordered: list[LogLine] = []

    def take(lines):
        for ln in lines:
            key = (ln.source, ln.no, ln.text)
            if key not in seen:
                seen.add(key)
                ordered.append(ln)

    sig_lines = sorted((ln for _, h in sigs for ln in h.lines()), key=lambda ln: (not at_root_line(ln), ln.source, ln.no))
    take(sig_lines[:3])
    for role in ("require", "context"):
        take(sorted((h.first[0] for s, h in matched if s.role == role), key=lambda ln: (ln.source, ln.no)))
    return ordered[:8]
