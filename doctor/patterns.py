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


def parse_standard(source: str):
    """The standard engine's parse tree, or None for syntax only the `regex` module knows."""
    try:
        return sre_parse.parse(source, stdlib_re.IGNORECASE)
    except Exception:  # noqa: BLE001
        return None


def required_literals(source: str, tree=None) -> tuple[str, ...] | None:
    """Literals of which at least one is in every line the pattern can match (collapsed form),
    or None when no useful literal can be read off the pattern."""
    tree = tree if tree is not None else parse_standard(source)
    if tree is None:
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
