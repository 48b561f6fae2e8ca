#!/usr/bin/env python3
"""Behaviour-diff harness for explain: what `explain --json` says (and what the failure reader
and the matcher found on the way) for every log the project holds, stored, then compared.

usage: python bench/explain_diff.py record OUT.jsonl [--big DIR [--only-big]]
       python bench/explain_diff.py diff OLD.jsonl NEW.jsonl

Inputs: tests/lab/*/*.log (the healthy ones too), tests/fixtures/**/*.log, docs/examples/*.log,
every log of ../shared/cases/*.jsonl, every catalog example excerpt (match and no_match), and,
with --big, every *.log in DIR (the throughput bench's logs, kept with its --keep). Each record
holds the JSON report and a digest of the internals (events, root lines, matcher hits), so that
a change that only shows in a later log is caught too."""

from __future__ import annotations

import glob
import io
import json
import os
import sys

BIG_BYTES = 20_000_000  # logs from this size have their report recorded, not the internals
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _inputs(big: str | None, only_big: bool = False):
    if only_big:
        for path in sorted(glob.glob(os.path.join(big, "*.log"))):
            yield f"big:{os.path.basename(path)}", ("path", path)
        return
    pats = ["tests/lab/*/*.log", "tests/fixtures/**/*.log", "docs/examples/*.log"]
    for pat in pats:
        for path in sorted(glob.glob(os.path.join(ROOT, pat), recursive=True)):
            yield os.path.relpath(path, ROOT), ("path", path)
    for cases in sorted(glob.glob(os.path.join(ROOT, "..", "shared", "cases", "*.jsonl"))
                        + glob.glob("/work/shared/cases/*.jsonl")):
        with open(cases, encoding="utf-8") as f:
            for n, raw in enumerate(f):
                case = json.loads(raw)
                yield f"case:{os.path.basename(cases)}:{case.get('id', n)}", ("text", case["log"])
    from mgft_doctor.catalog import load_catalog

    for e in load_catalog():
        for kind in ("match", "no_match"):
            for i, ex in enumerate(getattr(e, f"examples_{kind}")):
                yield f"example:{e.code}:{kind}:{i}", ("text", ex)
    if big:
        for path in sorted(glob.glob(os.path.join(big, "*.log"))):
            yield f"big:{os.path.basename(path)}", ("path", path)


def _ln(line):
    return None if line is None else [line.source, line.no, line.rank, line.text]


def _digest(sources, entries) -> dict:
    from mgft_doctor.explain import _read

    read = _read(sources, entries)
    a = read.analysis
    events = [[e.kind, _ln(e.line), e.primary, e.exit_code,
               None if e.traceback is None else [e.traceback.start, [f.no for f in e.traceback.frames],
                                                  _ln(e.traceback.exception), e.traceback.exc_type,
                                                  _ln(e.traceback.code)],
               [_ln(d) for d in e.detail]] for e in a.events]
    hits = {str(i): [_ln(x) for x in h.lines()] for i, h in sorted(read.matcher.hits.items())}
    return {"events": events, "root": None if a.root is None else [a.root.kind, _ln(a.root.line)],
            "root_lines": sorted(a.root_lines), "chained": [_ln(e.line) for e in a.chained],
            "consequences": [_ln(e.line) for e in a.consequences], "hits": hits,
            "failed_rank": a.failed_rank, "launcher_rank": a.launcher_rank, "stats": read.stats}


def _sources(spec):
    from mgft_doctor.explain.source import LogSource, open_log

    kind, value = spec
    if kind == "path":
        return open_log(value)
    return LogSource("<text>", io.BufferedReader(io.BytesIO(value.encode("utf-8", "replace"))), "utf-8")


def record(out: str, big: str | None, only_big: bool = False) -> None:
    if os.environ.get("EXPLAIN_DIFF_BLOCK"):  # small blocks: many block ends in small logs (old code and new alike)
        from mgft_doctor.explain.phase import PhaseTracker

        PhaseTracker.block_size = int(os.environ["EXPLAIN_DIFF_BLOCK"])
    from mgft_doctor.catalog import load_catalog
    from mgft_doctor.explain import explain_sources
    from mgft_doctor.errors import InputError

    entries = load_catalog()
    n = 0
    with open(out, "w", encoding="utf-8") as f:
        for name, spec in _inputs(big, only_big):
            rec = {"name": name}
            try:
                src = _sources(spec)
                try:
                    rec["json"] = explain_sources([src], False, entries).to_json()
                finally:
                    src.close()
                if spec[0] == "text" or os.path.getsize(spec[1]) < BIG_BYTES:  # internals, but of the biggest logs
                    src = _sources(spec)
                    try:
                        rec["internal"] = _digest([src], entries)
                    finally:
                        src.close()
            except InputError as exc:
                rec["error"] = str(exc)
            f.write(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    print(f"{n} inputs recorded in {out}")


def diff(old: str, new: str) -> int:
    def load(p):
        with open(p, encoding="utf-8") as f:
            return {r["name"]: r for r in map(json.loads, f)}

    a, b = load(old), load(new)
    bad = 0
    for name in sorted(set(a) | set(b)):
        ra, rb = a.get(name), b.get(name)
        if ra == rb:
            continue
        bad += 1
        if ra is None or rb is None:
            print(f"{name}: only in {'new' if ra is None else 'old'}")
            continue
        parts = [k for k in sorted(set(ra) | set(rb)) if ra.get(k) != rb.get(k)]
        detail = []
        for k in parts:
            if isinstance(ra.get(k), dict) and isinstance(rb.get(k), dict):
                detail += [f"{k}.{kk}" for kk in sorted(set(ra[k]) | set(rb[k])) if ra[k].get(kk) != rb[k].get(kk)]
            else:
                detail.append(k)
        print(f"{name}: differs in {', '.join(detail)}")
    print(f"{len(set(a) | set(b))} inputs, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "record":
        big = sys.argv[sys.argv.index("--big") + 1] if "--big" in sys.argv else None
        record(sys.argv[2], big, "--only-big" in sys.argv)
    elif len(sys.argv) == 4 and sys.argv[1] == "diff":
        sys.exit(diff(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
