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


def _literal_runs(seq) -> list[str]:
    runs, cur = [], []
    for op, av in seq:
        if op is sre_constants.LITERAL:
            cur.append(chr(av))
            continue
        if op is sre_constants.SUBPATTERN:
            sub = av[-1]
            if not any(o is sre_constants.BRANCH for o, _ in sub):
                inner = _literal_runs(sub)
                # a group made only of literals continues the run
                if len(inner) == 1 and all(o is sre_constants.LITERAL for o, _ in sub):
                    cur.append(inner[0])
                    continue
                runs.extend(inner)
        if op is sre_constants.MAX_REPEAT or op is sre_constants.MIN_REPEAT:
            lo, _hi, sub = av
            if lo >= 1:
                if cur:
                    runs.append("".join(cur))
                    cur = []
                runs.extend(_literal_runs(sub))
        runs.append("".join(cur))
        cur = []
    runs.append("".join(cur))
    return [r for r in runs if r]


def required_literals(source: str) -> tuple[str, ...] | None:
    """Literals of which at least one is in every line the pattern can match (collapsed form),
    or None when no useful literal can be read off the pattern."""
    try:
        tree = sre_parse.parse(source, stdlib_re.IGNORECASE)
    except Exception:  # regex-module syntax the standard parser lacks: no prefilter
        return None
    items = list(tree)
    if len(items) == 1 and items[0][0] is sre_constants.BRANCH:
        alternatives = []
        for branch in items[0][1][1]:
            runs = _literal_runs(branch)
            best = max(runs, key=len, default="")
            if len(best) < 3:
                return None
            alternatives.append(collapse(best))
        return tuple(alternatives)
    if len(items) == 1 and items[0][0] is sre_constants.SUBPATTERN:
        return required_literals_from_tree(items[0][1][-1])
    return required_literals_from_tree(items)


def required_literals_from_tree(items) -> tuple[str, ...] | None:
    items = list(items)
    if len(items) == 1 and items[0][0] is sre_constants.BRANCH:
        alternatives = []
        for branch in items[0][1][1]:
            best = max(_literal_runs(branch), key=len, default="")
            if len(best) < 3:
                return None
            alternatives.append(collapse(best))
        return tuple(alternatives)
    best = max(_literal_runs(items), key=len, default="")
    return (collapse(best),) if len(best) >= 3 else None


@dataclass
class Pattern:
    source: str
    fuzzy: int
    compiled: "regex.Pattern"
    literals: tuple[str, ...] | None

    @classmethod
    def compile(cls, source: str, fuzzy: int = 0) -> "Pattern":
        if fuzzy:
            compiled = regex.compile(f"(?:{source}){{e<={fuzzy}}}", regex.IGNORECASE | regex.V0)
            words = tuple(dict.fromkeys(collapse(w) for w in _WORD.findall(source)))
            literals = words or None
        else:
            compiled = regex.compile(source, regex.IGNORECASE | regex.V0)
            literals = required_literals(source)
        return cls(source, fuzzy, compiled, literals)

    def may_match(self, collapsed: str) -> bool:
        return self.literals is None or any(lit in collapsed for lit in self.literals)

    def search(self, text: str):
        try:
            return self.compiled.search(text, timeout=SEARCH_TIMEOUT_S)
        except TimeoutError:
            return None
