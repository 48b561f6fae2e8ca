"""Tracebacks read as records (scan.Record) give the same answers as their lines read one by
one: the scanner's lines, the failure reader's events and open tracebacks, and what the
matcher, the version finder and the phase tracker keep when most records of a block are
passed over (explain._Compactor)."""

from __future__ import annotations

import random

from mgft_doctor.catalog import load_catalog
from mgft_doctor.explain import _Compactor, _match_block, _triggers
from mgft_doctor.explain.failures import FailureReader
from mgft_doctor.explain.match import Matcher
from mgft_doctor.explain.phase import PhaseTracker
from mgft_doctor.explain.scan import _Scanner, expand
from mgft_doctor.explain.versions import LogVersions


def _flood(steps: int, seed: int) -> bytes:
    """Tracebacks of a few shapes under torchrun's rank tags, differing in digits (some of which
    change what the catalog matches: 29512, V100, 100 %), frames naming python3.10 or 3.11, open
    ones of ranks that later print more, and every form that is not a record: a frame without
    its source line before another frame, carets, a chain mark, an unraisable, another tag."""
    rnd = random.Random(seed)
    out = []
    for step in range(steps):
        r = rnd.choice([0, 1, 3, 3, 5])
        t = f"[rank{r}]: "
        if rnd.random() < 0.3:
            out.append(f"[rank{r}]: {{'loss': {rnd.random():.4f}}}")
        kind = rnd.random()
        if kind < 0.35:
            out += [t + "Traceback (most recent call last):",
                    t + f'  File "/opt/conda/lib/python3.1{rnd.choice("01")}/site-packages/deepspeed/runtime/engine.py", '
                        f'line {rnd.randrange(1000, 9999)}, in step',
                    t + "    self.optimizer.step()",
                    t + f"RuntimeError: bad value {rnd.choice(['29512', '12345', '100 %', 'V100', 'x1'])} at {rnd.randrange(10, 99)}"]
        elif kind < 0.55:
            out += [t + "Traceback (most recent call last):",
                    t + f'  File "/opt/app/data.py", line {rnd.randrange(10, 99)}, in load_sample',
                    t + f"json.decoder.JSONDecodeError: Expecting value: line 1 column {rnd.randrange(1, 9)} (char 0)"]
        elif kind < 0.7:
            rr = rnd.choice([20, 21, 22])
            out += [f"[rank{rr}]: Traceback (most recent call last):",
                    f'[rank{rr}]:   File "/opt/app/train.py", line {rnd.randrange(100, 999)}, in step']
            if rnd.random() < 0.3:
                out += [f"[rank{rr}]: other output {step}", f"[rank{rr}]: ValueError: late {step}"]
        elif kind < 0.75:
            out += [t + "Exception ignored in: <function X.__del__>", t + "Traceback (most recent call last):",
                    t + f'  File "/opt/app/x.py", line {rnd.randrange(10, 99)}, in __del__', t + "OSError: closed"]
        elif kind < 0.8:
            out += [t + "Traceback (most recent call last):", t + '  File "/a.py", line 3, in f', t + '  File "/b.py", line 4, in g',
                    t + "    x()", t + "    ^^^", t + "KeyError: 'k'"]
        elif kind < 0.85:
            out += [t + "Traceback (most recent call last):", t + f'  File "/a.py", line {rnd.randrange(10, 99)}, in f',
                    t + "AssertionError", t + "The above exception was the direct cause of the following exception:"]
        else:
            out += [t + "Traceback (most recent call last):",
                    t + f'  File "/opt/app/data.py", line {rnd.randrange(10, 99)}, in load_sample',
                    t + "    sample = json.loads(raw)", t + f"KeyError: 'k{rnd.randrange(10, 99)}'"]
    out += ["Root Cause (first observed failure):", "  rank      : 3 (local_rank: 3)", "  exitcode  : 1 (pid: 7791)"]
    return ("\n".join(out) + "\n").encode()


def _blocks(data: bytes, size: int) -> list[bytes]:
    blocks, at = [], 0
    while at < len(data):
        cut = data.rfind(b"\n", at, at + size) + 1
        cut = len(data) if cut <= at else cut
        blocks.append(data[at:cut])
        at = cut
    return blocks


def _read(data: bytes, size: int, records: bool):
    entries = load_catalog()
    triggers = _triggers(entries)
    scanner, reader, matcher = _Scanner(triggers, 0), FailureReader(), Matcher(entries)
    versions, phases, compactor = LogVersions(), PhaseTracker(), _Compactor(matcher)
    seen, line_at, n_passed = [], 1, 0
    for block in _blocks(data, size):
        found = []
        lines = scanner._sparse_lines(block, line_at, found if records else None)
        seen += [(ln.no, ln.rank, ln.text) for ln in expand(lines, found)]
        reader.feed_block(lines, found)
        given = compactor.compact(lines, found) if found else lines
        n_passed += len(expand(lines, found)) - len(given)
        _match_block(matcher, given)
        versions.feed_block(given)
        phases.feed_block(given, (lines, found) if found else None)
        line_at += scanner.newlines
    analysis = reader.finish()
    events = [(e.kind, e.line.no, e.line.rank, e.primary, e.traceback and [f.no for f in e.traceback.frames])
              for e in analysis.events]
    opened = {k: [f.no for f in reader._traceback(k).frames] for k in list(reader._open)}
    hits = {i: [(ln.no, ln.text) for ln in h.lines()] for i, h in matcher.hits.items()}
    return seen, events, opened, hits, dict(versions.found), n_passed


def test_records_read_as_their_lines():
    for seed, size in ((1, 1 << 14), (2, 1 << 16), (3, 1 << 20)):
        data = _flood(4000, seed)
        by_line = _read(data, size, records=False)
        by_record = _read(data, size, records=True)
        assert by_record[:5] == by_line[:5]
        assert by_line[5] == 0 and by_record[5] > 200  # many records were passed over, and it showed nowhere
