"""A catalog pattern: a `regex` expression (case-insensitive, optionally fuzzy for retyped
messages, always searched with a time limit) and the literals that any match must contain,
which let the matcher skip the regex on lines that cannot match."""

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


@dataclass
class Pattern:
    source: str
    fuzzy: int
    literals: tuple[str, ...] | None
    _compiled: "regex.Pattern | None" = None

    @classmethod
    def compile(cls, source: str, fuzzy: int = 0) -> "Pattern":
        """Check the pattern now (raises regex.error); build the matcher on first use, since
        the literal prefilter spares most patterns of a given log from ever running."""
        tree = parse_standard(source)
        if fuzzy:
            literals = tuple(dict.fromkeys(collapse(w) for w in _WORD.findall(source))) or None
        else:
            literals = required_literals(source, tree)
        pattern = cls(source, fuzzy, literals)
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
        return self.literals is None or any(lit in collapsed for lit in self.literals)

    def search(self, text: str):
        try:
            return self._build().search(text, timeout=SEARCH_TIMEOUT_S)
        except TimeoutError:
            return None
