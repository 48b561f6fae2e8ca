"""The known-errors catalog: one YAML file per stable code in known_errors/, loaded and checked.

Data lives apart from code so that adding a failure class is adding a file. Loading validates
every field (entry.py) and names the file and field of any mistake; compiled patterns are cached."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
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
    paths = sorted(Path(directory).glob("*.yaml"))
    disk = _DiskCache(paths) if directory == str(catalog_dir()) else None
    found = disk.load() if disk is not None else None
    if found is not None:
        return found
    entries: dict[str, Entry] = {}
    for path in paths:
        entry = load_file(path)
        if entry.code in entries:
            raise CatalogError(str(path), "code", f"duplicate of {entries[entry.code].path}")
        entries[entry.code] = entry
    loaded = tuple(entries[c] for c in sorted(entries))
    if disk is not None:
        disk.save(loaded)
    return loaded


NO_CACHE_ENV = "MGFT_DOCTOR_NO_CACHE"  # set (to anything but '' or '0') to read the YAML files every time


class _DiskCache:
    """The installed catalog as loaded (parsed, checked, patterns prepared: ~0.4 s of every
    command's start-up), pickled under $XDG_CACHE_HOME/mgft-doctor (~/.cache/mgft-doctor).
    The file's name is a digest of the bytes of every catalog file and of the code that builds
    the entries from them (this package's modules), and of the Python version, so a cache is
    never stale: any edit names another file. Reading or writing it never fails a command:
    a cache that cannot be read is rebuilt, one that cannot be written is skipped."""

    KEEP = 4  # cache files kept; older ones (of earlier catalogs) are removed

    def __init__(self, paths: list[Path]):
        self.file: Path | None = None
        if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
            return
        try:
            digest = hashlib.sha256(sys.version.encode())
            for path in [*paths, *sorted(Path(__file__).parent.glob("*.py"))]:
                data = path.read_bytes()
                digest.update(b"%s %d\0" % (path.name.encode(), len(data)))
                digest.update(data)
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            self.file = Path(base) / "mgft-doctor" / f"catalog-{digest.hexdigest()[:32]}.pickle"
        except (OSError, RuntimeError, ValueError):
            self.file = None  # unreadable here: load_file names the problem

    def load(self) -> tuple[Entry, ...] | None:
        if self.file is None:
            return None
        try:
            with open(self.file, "rb") as f:
                found = pickle.load(f)
        except Exception:  # noqa: BLE001 - absent, truncated or foreign: rebuilt from the YAML files
            return None
        if isinstance(found, tuple) and all(isinstance(e, Entry) for e in found):
            return found
        return None

    def save(self, entries: tuple[Entry, ...]) -> None:
        if self.file is None:
            return
        try:
            self.file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".catalog-", dir=self.file.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump(entries, f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, self.file)
            except BaseException:
                os.unlink(tmp)
                raise
            old = sorted(self.file.parent.glob("catalog-*.pickle"), key=lambda p: p.stat().st_mtime)
            for stale in old[:-self.KEEP]:
                stale.unlink()
        except Exception:  # noqa: BLE001 - read-only home, full disk, unpicklable entry: no cache, same entries
            return


def find_entry(code: str, entries: list[Entry] | None = None) -> Entry | None:
    code = code.strip().upper()
    for e in entries or load_catalog():
        if e.code == code:
            return e
    return None
