"""The installed catalog is pickled once under $XDG_CACHE_HOME and read from there after: the
same entries, a new file whenever a catalog file or the code that loads it changes, and no
failure when the cache cannot be written or read."""

from __future__ import annotations

import pytest

from mgft_doctor import catalog
from mgft_doctor.catalog import _DiskCache, catalog_dir, load_catalog
from mgft_doctor.explain import explain_text


def _fresh():
    catalog._load_cached.cache_clear()
    return load_catalog()


def _same(a, b):
    assert [(e.code, e.title, [p.source for p in e.signatures], e.examples_match) for e in a] == \
           [(e.code, e.title, [p.source for p in e.signatures], e.examples_match) for e in b]


@pytest.fixture(autouse=True)
def _clean_memory_cache(monkeypatch):
    monkeypatch.delenv(catalog.NO_CACHE_ENV, raising=False)
    catalog._load_cached.cache_clear()
    yield
    catalog._load_cached.cache_clear()


def test_cache_is_written_then_read(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(catalog.NO_CACHE_ENV, "1")
    plain = _fresh()
    assert not (tmp_path / "mgft-doctor").exists()
    monkeypatch.delenv(catalog.NO_CACHE_ENV)
    first = _fresh()
    files = list((tmp_path / "mgft-doctor").glob("catalog-*.pickle"))
    assert len(files) == 1
    second = _fresh()
    _same(plain, first)
    _same(plain, second)
    entry = second[0]  # the unpickled patterns still match
    report = explain_text(entry.examples_match[0], list(second))
    assert entry.code in [d.code for d in report.diagnoses]


def test_a_changed_catalog_file_names_another_cache(tmp_path):
    paths = sorted(catalog_dir().glob("*.yaml"))[:3]
    copies = []
    for p in paths:
        q = tmp_path / p.name
        q.write_bytes(p.read_bytes())
        copies.append(q)
    before = _DiskCache(copies).file
    copies[1].write_bytes(copies[1].read_bytes() + b"\n# edited\n")
    assert _DiskCache(copies).file != before


def test_unwritable_or_damaged_cache_is_no_failure(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    _same(_fresh(), load_catalog())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    good = _fresh()
    (cached,) = (tmp_path / "cache" / "mgft-doctor").glob("catalog-*.pickle")
    cached.write_bytes(b"\x80\x05 truncated")
    _same(good, _fresh())
    cached.write_bytes(b"\x80\x05K\x01.")  # a pickle of something else: the integer 1
    _same(good, _fresh())
