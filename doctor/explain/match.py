"""Match salient log lines against the catalog and rank the entries by their evidence.

Each line is first reduced to the patterns whose literals it contains (one Aho-Corasick pass
over the line, whatever the size of the catalog); only those run as regexes. What repeats is
evaluated once: a line seen before costs one lookup, and the verdict of a pattern that cannot
tell digits apart is kept per line shape (digits collapsed), so a million progress lines or
warnings cost one lookup each. A pattern that times out three times is not run again.
Scoring: a signature at the root error counts most, a signature elsewhere less, each required
context group and supporting context line adds, an exclusion removes the entry."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from ..catalog import Entry
from .lines import LogLine
from ..catalog.patterns import TIMED_OUT, Pattern, collapse

KEEP_FIRST = 4
KEEP_LAST = 4
CACHE_LIMIT = 50_000  # entries of each cache; a cache that fills up starts again
CACHE_MAX_CHARS = 600  # longer lines are rarely repeated: not worth the memory
GATES_MAX = 1_000  # sets of candidates remembered with their literals' regex (few: a shape's candidates recur)
_NO_GATE = object()
MAX_TIMEOUTS = 3  # time-outs after which a pattern is left out for the rest of the log
_DIGIT_BYTES = bytes.maketrans(b"0123456789", b"0000000000")
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
    role: str  # signature, require, context, exclude, undo (of the excludes before it)
    group: int
    pattern: Pattern


@dataclass
class Hits:
    """Where one pattern matched: the first and the latest few lines."""

    first: list[LogLine] = field(default_factory=list)
    last: deque = field(default_factory=lambda: deque(maxlen=KEEP_LAST))

    def add(self, line: LogLine) -> None:
        if len(self.first) < KEEP_FIRST:
            self.first.append(line)
        else:
            self.last.append(line)

    def lines(self) -> list[LogLine]:
        return self.first + list(self.last)

    @classmethod
    def merged(cls, parts: list["Hits"]) -> "Hits":
        """The hits of one pattern from the hits of the line groups it matched in: its first lines
        are among the groups' first ones, its latest among their latest (each line is in one group)."""
        if len(parts) == 1:
            return parts[0]
        lines = sorted((ln for h in parts for ln in h.lines()), key=lambda ln: (ln.source, ln.no))
        out = cls(lines[:KEEP_FIRST])
        out.last.extend(lines[KEEP_FIRST:])
        return out


@dataclass
class Candidate:
    entry: Entry
    score: float
    evidence: list[LogLine]
    at_root: bool
    rank: int | None


class _Prefilter:
    """Which patterns may match a collapsed line: one Aho-Corasick pass finds every literal the
    catalog's patterns need (ahocorasick_rs); without it, each pattern's own check."""

    def __init__(self, patterns: list[Pattern]):
        self.patterns = patterns
        self.always = [i for i, p in enumerate(patterns) if p.literals is None and p.need <= 1]
        literals: dict[str, int] = {}
        self.any_of: list[list[int]] = []  # literal id -> patterns that need one of their literals
        self.words_of: list[list[int]] = []  # literal id -> fuzzy patterns that count it as a word
        for i, p in enumerate(patterns):
            for lit in p.literals or ():
                self._slot(literals, lit)[0].append(i)
            for word in p.words if p.need > 1 else ():
                self._slot(literals, word)[1].append(i)
        try:
            import ahocorasick_rs
        except ImportError:
            self._ac = None
        else:
            # a contiguous NFA: built in ~9 ms against the DFA's ~60 ms (explain's start-up), and
            # it only reads the lines of shapes not seen before, so its slower search costs little
            self._ac = ahocorasick_rs.AhoCorasick(list(literals), matchkind=ahocorasick_rs.MatchKind.Standard,
                                                 implementation=ahocorasick_rs.Implementation.ContiguousNFA)

    def _slot(self, literals: dict[str, int], text: str) -> tuple[list[int], list[int]]:
        if text not in literals:
            literals[text] = len(self.any_of)
            self.any_of.append([])
            self.words_of.append([])
        n = literals[text]
        return self.any_of[n], self.words_of[n]

    def candidates(self, collapsed: str) -> list[int]:
        if self._ac is None:
            return [i for i, p in enumerate(self.patterns) if p.may_match(collapsed)]
        found = {n for n, _, _ in self._ac.find_matches_as_indexes(collapsed, overlapping=True)}
        any_hit: set[int] = set()
        words: dict[int, int] = {}
        for n in found:
            any_hit.update(self.any_of[n])
            for i in self.words_of[n]:
                words[i] = words.get(i, 0) + 1
        patterns = self.patterns
        pool = any_hit.union(self.always, (i for i in words if patterns[i].literals is None))
        return sorted(i for i in pool if (patterns[i].literals is None or i in any_hit)
                      and (patterns[i].need <= 1 or words.get(i, 0) >= patterns[i].need))


_PREFILTERS: dict[tuple[int, ...], _Prefilter] = {}


def _prefilter_for(patterns: list[Pattern]) -> _Prefilter:
    """One prefilter per catalog: building the automaton takes ~20 ms, and the pytest plugin
    explains every failing test. The cached one holds its patterns, so their ids stay theirs."""
    key = tuple(map(id, patterns))
    found = _PREFILTERS.get(key)
    if found is None:
        if len(_PREFILTERS) >= 4:
            _PREFILTERS.clear()
        found = _PREFILTERS[key] = _Prefilter(patterns)
    return found


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
            for p in entry.excludes_undone_by:
                self.slots.append(_Slot(ei, "undo", 0, p))
        # hits per group of slots that matched the same lines: a line is recorded once, however many
        # patterns it matches (a warning printed at every step matches several entries' context)
        self._groups: dict[tuple[int, ...], Hits] = {}
        self._prefilter = _prefilter_for([s.pattern for s in self.slots])
        self._seen: dict[str, tuple[int, ...]] = {}  # exact line -> the slots that match it
        self._shapes: dict[bytes, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # shape -> (blind hits, others to try)
        self._timeouts: dict[int, int] = {}
        self._exact = [s.pattern.exact for s in self.slots]  # each slot's literals with their digits, for _gate
        self._gates: dict[tuple[int, ...], "re.Pattern[str] | None"] = {}  # candidates -> any of their literals (_gate)
        self._byte_gates: dict[tuple[int, ...], "re.Pattern[bytes]"] = {}  # the same, for ASCII bytes (shape_probe)

    def _search(self, i: int, text: str) -> bool:
        if self._timeouts.get(i, 0) >= MAX_TIMEOUTS:
            return False
        found = self.slots[i].pattern.try_search(text)
        if found is TIMED_OUT:
            self._timeouts[i] = self._timeouts.get(i, 0) + 1
            return False
        return found is not None

    def _shape(self, text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        key = text.encode("utf-8", "surrogatepass").translate(_DIGIT_BYTES)
        found = self._shapes.get(key)
        if found is None:
            candidates = self._prefilter.candidates(collapse(text))
            blind = tuple(i for i in candidates if self.slots[i].pattern.blind and self._search(i, text))
            others = tuple(i for i in candidates if not self.slots[i].pattern.blind)
            found = (blind, others)
            if len(text) <= CACHE_MAX_CHARS:
                if len(self._shapes) >= CACHE_LIMIT:
                    self._shapes.clear()
                self._shapes[key] = found
        return found

    def shape_probe(self, text: str):
        """How to tell matching_slots() of another text of text's shape (digits aside): None
        when it is the same for all (no pattern that tells digits apart may match them); else
        (the slots when none of those patterns' literals is in the text, a bytes regex that
        finds any of those literals in lower-cased ASCII bytes, or None when one has none)."""
        blind, others = self._shape(text)
        if not others:
            return None
        if any(self._exact[i] is None for i in others):
            return blind, None
        gate = self._byte_gates.get(others)
        if gate is None:
            if len(self._byte_gates) >= GATES_MAX:
                self._byte_gates.clear()
            lits = sorted({re.escape(lit.encode("utf-8")) for i in others for lit in self._exact[i]})
            gate = self._byte_gates[others] = re.compile(b"|".join(lits))
        return blind, gate

    def _gate(self, others: tuple[int, ...]) -> "re.Pattern[str] | None":
        """One regex for any of the literals (digits kept) of these candidates; None when one of
        them has none (it must be tried whatever the line holds)."""
        if any(self._exact[i] is None for i in others):
            gate = None
        else:
            gate = re.compile("|".join(sorted({re.escape(lit) for i in others for lit in self._exact[i]})))
        if len(self._gates) >= GATES_MAX:
            self._gates.clear()
        self._gates[others] = gate
        return gate

    def matching_slots(self, text: str) -> tuple[int, ...]:
        """Indices of the slots whose pattern matches text, ascending."""
        found = self._seen.get(text)
        if found is None:
            blind, others = self._shape(text)
            if others:
                # Pattern.may_match_lowered of all the candidates at once: a line of unique digits (a step, a
                # byte offset) comes here each time with the same few candidates of its shape, and
                # one search for all their literals at once rules them out together (most lines)
                lowered = text.lower()
                gate = self._gates.get(others, _NO_GATE)
                if gate is _NO_GATE:
                    gate = self._gate(others)
                if gate is not None and gate.search(lowered) is None:
                    others = ()
                else:
                    slots = self.slots
                    others = tuple(i for i in others if slots[i].pattern.may_match_lowered(lowered) and self._search(i, text))
            found = tuple(sorted(blind + others)) if others else blind
            if len(text) <= CACHE_MAX_CHARS:
                if len(self._seen) >= CACHE_LIMIT:
                    self._seen.clear()
                self._seen[text] = found
        return found

    @property
    def memo(self) -> dict[str, tuple[int, ...]]:
        """text -> matching_slots(text), for the texts remembered (emptied in place when full)."""
        return self._seen

    def add(self, slots: tuple[int, ...], lines: list[LogLine]) -> None:
        """feed() each of lines, whose matching slots are known to be `slots` (not empty)."""
        hits = self._groups.get(slots)
        if hits is None:
            hits = self._groups[slots] = Hits()
        for line in lines:
            hits.add(line)

    def feed(self, line: LogLine) -> None:
        slots = self.matching_slots(line.text)
        if slots:
            hits = self._groups.get(slots)
            if hits is None:
                hits = self._groups[slots] = Hits()
            hits.add(line)

    @property
    def hits(self) -> dict[int, Hits]:
        """slot index -> where its pattern matched."""
        parts: dict[int, list[Hits]] = {}
        for slots, hits in self._groups.items():
            for i in slots:
                parts.setdefault(i, []).append(hits)
        return {i: Hits.merged(p) for i, p in parts.items()}

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
            sigs = [(s, h) for s, h in matched if s.role == "signature"]
            if not sigs or _excluded(entry, matched, sigs):
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


def _excluded(entry, matched: list, sigs: list) -> bool:
    """An exclude hit rules the entry out, unless a line of excludes_undone_by comes after it; with
    excludes_only_after, only one after the last signature line of the same log (its lines are in order)."""
    excludes = [ln for s, h in matched if s.role == "exclude" for ln in h.lines()]
    undone = {}  # source -> the last line that undoes the excludes before it
    for s, h in matched:
        if s.role == "undo":
            for ln in h.lines():
                undone[ln.source] = max(undone.get(ln.source, -1), ln.no)
    excludes = [ln for ln in excludes if ln.no >= undone.get(ln.source, -1)]
    if not excludes:
        return False
    if not entry.excludes_only_after:
        return True
    last = {}
    for _, h in sigs:
        for ln in h.lines():
            last[ln.source] = max(last.get(ln.source, -1), ln.no)
    return any(ln.no > last.get(ln.source, -1) for ln in excludes)
