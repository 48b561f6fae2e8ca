"""A catalog pattern: a `regex` expression (case-insensitive, optionally fuzzy for retyped
messages, always searched with a time limit) and the literals that any match must contain,
which let the matcher skip the regex on lines that cannot match.

Each pattern is compiled once (on first use: the literal prefilter spares most patterns of a
given log from ever running) and every search carries SEARCH_TIMEOUT_S, so that no pattern and
no line can stall explain; `try_search` tells a time-out apart from "no match"."""

from __future__ import annotations

import re as stdlib_re
from dataclasses import dataclass

import regex

try:  # Python 3.11+: the parser of the standard engine, used only to read literals off a pattern
    from re import _constants as sre_constants, _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

SEARCH_TIMEOUT_S = 0.05  # a pattern that takes longer on one line is a catalog bug, not a hang
TIMED_OUT = object()  # what try_search returns when the time limit cut a search short
_DIGITS = str.maketrans("0123456789", "0000000000")
_WORD = stdlib_re.compile(r"[A-Za-z_][A-Za-z_0-9]{4,}")


def collapse(text: str) -> str:
    """Lower-case with every digit turned into 0: the key under which line prefilters are cached."""
    return text.lower().translate(_DIGITS)


def parse_standard(source: str):
    """The standard engine's parse tree, or None for syntax only the `regex` module knows."""
    try:
        return sre_parse.parse(source, stdlib_re.IGNORECASE)
    except Exception:  # noqa: BLE001
        return None


MIN_LITERAL = 2


def _best(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The more selective of two any-of literal sets: longer shortest member, then fewer members."""
    if a is None:
        return b
    if b is None:
        return a
    ka = (min(map(len, a)), -len(a))
    kb = (min(map(len, b)), -len(b))
    return a if ka >= kb else b


def _seq_literals(items) -> tuple[str, ...] | None:
    """Best any-of set of literals for a sequence: one of them occurs in every match."""
    best: tuple[str, ...] | None = None
    run: list[str] = []

    def flush():
        nonlocal best, run
        if run:
            best = _best(best, ("".join(run),))
            run = []

    for op, av in items:
        if op is sre_constants.LITERAL:
            run.append(chr(av))
            continue
        if op is sre_constants.SUBPATTERN:
            sub = list(av[-1])
            if sub and all(o is sre_constants.LITERAL for o, _ in sub):
                run.extend(chr(v) for _, v in sub)  # a group of plain literals continues the run
                continue
            flush()
            best = _best(best, _seq_literals(sub))
            continue
        flush()
        if op is sre_constants.BRANCH:
            alternatives = [_seq_literals(list(branch)) for branch in av[1]]
            if all(alternatives):
                best = _best(best, tuple(dict.fromkeys(x for alt in alternatives for x in alt)))
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT) and av[0] >= 1:
            best = _best(best, _seq_literals(list(av[2])))
    flush()
    if best is not None and min(map(len, best)) < MIN_LITERAL:
        return None
    return best


def required_literals(source: str, tree=None) -> tuple[str, ...] | None:
    """Literals of which at least one is in every line the pattern can match (collapsed form),
    or None when no useful literal can be read off the pattern."""
    tree = tree if tree is not None else parse_standard(source)
    if tree is None:
        return None
    found = _seq_literals(list(tree))
    return tuple(dict.fromkeys(collapse(x) for x in found)) if found else None


class Guarded:
    """A standard-library regex that is searched only when one of the literals that every match
    contains is in the text: a cheap substring test spares the engine most lines. Behaves like
    the pattern for search, match and finditer."""

    def __init__(self, regex: "stdlib_re.Pattern[str]"):
        self.regex = regex
        self.pattern = regex.pattern
        self.literals = exact_literals(regex)

    def _may(self, text: str) -> bool:
        literals = self.literals
        if literals is None:
            return True
        for lit in literals:  # a loop, not any() over a generator: this runs on most salient lines
            if lit in text:
                return True
        return False

    def search(self, text: str, *args):
        return self.regex.search(text, *args) if self._may(text) else None

    def match(self, text: str, *args):
        return self.regex.match(text, *args) if self._may(text) else None

    def finditer(self, text: str, *args):
        return self.regex.finditer(text, *args) if self._may(text) else iter(())


def guard(pattern: "stdlib_re.Pattern[str] | str") -> Guarded:
    return Guarded(stdlib_re.compile(pattern) if isinstance(pattern, str) else pattern)


def exact_literals(pattern: "stdlib_re.Pattern[str]") -> tuple[str, ...] | None:
    """Case-exact literals of which one is in every match of a case-sensitive str pattern, or
    None (no guard) when none can be read off it or case folding is involved anywhere."""
    if not isinstance(pattern.pattern, str) or pattern.flags & stdlib_re.IGNORECASE or "(?i" in pattern.pattern:
        return None
    try:
        tree = sre_parse.parse(pattern.pattern, pattern.flags)
    except Exception:  # noqa: BLE001
        return None
    found = _seq_literals(list(tree))
    return tuple(dict.fromkeys(found)) if found else None


_WORD_SPLIT = stdlib_re.compile(r"[^a-z0-9_]+")
MIN_WORD = 3


def mandatory_words(tree) -> tuple[str, ...]:
    """Distinct words (collapsed) that every exact match of the parsed pattern contains: the
    literal runs of its mandatory parts, split at non-word characters. An edit of a fuzzy match
    breaks at most one of them, so a match with e errors keeps all but e."""
    runs: list[str] = []

    def walk(items) -> None:
        run: list[str] = []
        for op, av in items:
            if op is sre_constants.LITERAL:
                run.append(chr(av))
                continue
            runs.append("".join(run))
            run = []
            if op is sre_constants.SUBPATTERN:
                walk(av[-1])
            elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT) and av[0] >= 1:
                walk(av[2])
            elif op is sre_constants.ATOMIC_GROUP:
                walk(av)
        runs.append("".join(run))

    walk(list(tree))
    words = (w for r in runs for w in _WORD_SPLIT.split(collapse(r)) if len(w) >= MIN_WORD)
    return tuple(dict.fromkeys(words))


_ALL_DIGITS = frozenset(range(ord("0"), ord("9") + 1))
_UNIFORM_OPS = {"ANY", "AT", "CATEGORY", "FAILURE", "SUCCESS"}  # treat every digit alike


def _class_digits(items) -> frozenset[int]:
    """The digits a character class [...] accepts."""
    negate = False
    accepted: set[int] = set()
    for op, av in items:
        if op is sre_constants.NEGATE:
            negate = True
        elif op is sre_constants.LITERAL:
            accepted |= {av} & _ALL_DIGITS
        elif op is sre_constants.RANGE:
            accepted |= {d for d in _ALL_DIGITS if av[0] <= d <= av[1]}
        elif op is sre_constants.CATEGORY and str(av) in ("CATEGORY_DIGIT", "CATEGORY_WORD", "CATEGORY_NOT_SPACE", "CATEGORY_NOT_LINEBREAK"):
            accepted |= _ALL_DIGITS
    return _ALL_DIGITS - accepted if negate else frozenset(accepted)


def digit_blind(tree) -> bool:
    """True when the pattern cannot tell one digit from another (no digit literal, no class with
    some digits but not all, no back-reference): its verdict on a line then holds for every line
    that differs from it only in digits, which lets the matcher cache it per line shape."""
    if tree is None:
        return False

    def walk(items) -> bool:
        for op, av in items:
            name = str(op)
            if op in (sre_constants.LITERAL, sre_constants.NOT_LITERAL):
                if av in _ALL_DIGITS:
                    return False
            elif op is sre_constants.IN:
                if _class_digits(av) not in (frozenset(), _ALL_DIGITS):
                    return False
            elif op is sre_constants.SUBPATTERN:
                if not walk(av[-1]):
                    return False
            elif op is sre_constants.BRANCH:
                if not all(walk(branch) for branch in av[1]):
                    return False
            elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT):
                if not walk(av[2]):
                    return False
            elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
                if not walk(av[1]):
                    return False
            elif op is sre_constants.ATOMIC_GROUP:
                if not walk(av):
                    return False
            elif name not in _UNIFORM_OPS:
                return False  # back-references, conditionals, anything unforeseen: not blind
        return True

    return walk(list(tree))


@dataclass
class Pattern:
    source: str
    fuzzy: int
    literals: tuple[str, ...] | None  # one of these is in every line the pattern matches
    words: tuple[str, ...] = ()  # fuzzy patterns: at least `need` of these are in every match
    need: int = 0
    blind: bool = False  # digit_blind: the verdict holds for every line of the same digit-collapsed shape
    exact: tuple[str, ...] | None = None  # the literals lower-cased but with their digits: for patterns that are not blind
    _compiled: "regex.Pattern | None" = None

    @classmethod
    def compile(cls, source: str, fuzzy: int = 0) -> "Pattern":
        """Check the pattern now (raises regex.error); build the matcher on first use, since
        the literal prefilter spares most patterns of a given log from ever running."""
        tree = parse_standard(source)
        words: tuple[str, ...] = ()
        need = 0
        if fuzzy:
            literals = tuple(dict.fromkeys(collapse(w) for w in _WORD.findall(source))) or None
            if tree is not None:
                words = mandatory_words(tree)
                need = max(0, len(words) - fuzzy)
        else:
            literals = required_literals(source, tree)
        exact = None
        if not fuzzy and tree is not None:
            found = _seq_literals(list(tree))
            exact = tuple(dict.fromkeys(x.lower() for x in found)) if found else None
        pattern = cls(source, fuzzy, literals, words, need, digit_blind(tree), exact)
        if tree is None or fuzzy:
            pattern._build()  # syntax the standard parser could not vouch for
        return pattern

    def _build(self) -> "regex.Pattern":
        if self._compiled is None:
            src = f"(?:{self.source}){{e<={self.fuzzy}}}" if self.fuzzy else self.source
            self._compiled = regex.compile(src, regex.IGNORECASE | regex.V0)
        return self._compiled

    @property
    def compiled(self) -> "regex.Pattern":
        return self._build()

    def may_match(self, collapsed: str) -> bool:
        """The prefilter on a collapsed line: False means the regex cannot match it."""
        literals = self.literals
        if literals is not None:
            for lit in literals:  # a loop, not any() over a generator (cheaper per line)
                if lit in collapsed:
                    break
            else:
                return False
        return self.need <= 1 or sum(w in collapsed for w in self.words) >= self.need

    def may_match_lowered(self, lowered: str) -> bool:
        """The prefilter on the line lower-cased, digits kept: for a pattern that tells digits
        apart, '295' must be in the line, not just any three digits."""
        exact = self.exact
        if exact is None:
            return True
        for lit in exact:  # a loop, not any() over a generator (cheaper per line)
            if lit in lowered:
                return True
        return False

    def try_search(self, text: str):
        """The match, None, or TIMED_OUT when the search ran past SEARCH_TIMEOUT_S."""
        try:
            return self._build().search(text, timeout=SEARCH_TIMEOUT_S)
        except TimeoutError:
            return TIMED_OUT

    def search(self, text: str):
        found = self.try_search(text)
        return None if found is TIMED_OUT else found
