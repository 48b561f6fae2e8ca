"""The known-errors catalog: one YAML file per stable code in known_errors/, loaded and checked.

Data lives apart from code so that adding a failure class is adding a file. Loading validates
every field (entry.py) and names the file and field of any mistake; compiled patterns are cached."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import yaml

from ..errors import CatalogError
from .entry import AREAS, CODE_FORMAT, Entry, Fix, VersionCondition, parse_entry

__all__ = ["AREAS", "CODE_FORMAT", "Entry", "Fix", "VersionCondition", "parse_entry", "load_file", "catalog_dir",
           "load_catalog", "find_entry"]

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml is 10x faster when present


def load_file(path: Path) -> Entry:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(str(path), "<file>", f"cannot read: {exc}")
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise CatalogError(str(path), "<yaml>", f"not valid YAML ({where}: {getattr(exc, 'problem', exc)})")
    return parse_entry(data, str(path))


def catalog_dir() -> Path:
    return Path(str(resources.files("mgft_doctor.known_errors")))


def load_catalog(directory: Path | None = None) -> list[Entry]:
    """Every entry, sorted by code; duplicate codes are an error."""
    directory = directory or catalog_dir()
    return list(_load_cached(str(directory)))


@functools.lru_cache(maxsize=4)
def _load_cached(directory: str) -> tuple[Entry, ...]:
    entries: dict[str, Entry] = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        entry = load_file(path)
        if entry.code in entries:
            raise CatalogError(str(path), "code", f"duplicate of {entries[entry.code].path}")
        entries[entry.code] = entry
    return tuple(entries[c] for c in sorted(entries))


def find_entry(code: str, entries: list[Entry] | None = None) -> Entry | None:
    code = code.strip().upper()
    for e in entries or load_catalog():
        if e.code == code:
            return e
    return None
