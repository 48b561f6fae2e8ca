"""Small text helpers every subsystem uses, kept in one place (a leaf: imports only the stdlib)."""

from __future__ import annotations

import re
from typing import Iterable

GiB = 1 << 30

# CSI sequences (colours, cursor moves), OSC sequences (titles, hyperlinks) and two-byte escapes
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def split_csv(values: Iterable) -> list[str]:
    """['a,b', 'c'] -> ['a', 'b', 'c']: repeatable, comma-separated options."""
    return [v.strip() for item in values for v in str(item).split(",") if v.strip()]


def truthy(value) -> bool:
    """A YAML or environment flag as LLaMA-Factory reads it (true, 1, yes, y, on)."""
    return value is True or (isinstance(value, (str, int)) and not isinstance(value, bool)
                             and str(value).strip().lower() in ("1", "true", "yes", "y", "on"))


def one_line(text, limit: int = 400) -> str:
    """Whitespace collapsed and cut at limit characters, with an ellipsis when cut."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
