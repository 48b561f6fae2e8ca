"""explain cannot be stalled or bloated by what it reads: a pathological catalog pattern or line
costs a bounded time (every search has a time limit; a pattern that times out is dropped for the
rest of the log), the log-line expressions are linear, work per line does not grow with the
catalog or with the lines before it, and the reader's memory is bounded however many errors or
tracebacks a log holds."""

from __future__ import annotations

import time
from pathlib import Path

from mgft_doctor.catalog import load_catalog
from mgft_doctor.catalog.patterns import Pattern, collapse
from mgft_doctor.explain import explain_text
from mgft_doctor.explain.failures import MAX_OPEN_TRACEBACKS, FailureReader
from mgft_doctor.explain.lines import LogLine, normalise, split_rank
from mgft_doctor.explain.match import Matcher

FAILING = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/x/site-packages/deepspeed/runtime/engine.py", line 1997, in no_sync\n'
    "[rank0]: AssertionError: no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage 3\n"
)
CATASTROPHIC = r"(a+)+b"  # exponential backtracking on a line of a's with no b
ENTRY = """code: MGD999
title: "a catalog entry with a catastrophic pattern"
area: nccl
match:
  signatures:
    - '{sig}'
explanation: x
fixes: [a]
references: ['https://example.org']
examples: {{match: [a], no_match: [b]}}
"""


def _bad_catalog(tmp_path: Path, sig: str = CATASTROPHIC) -> list:
    (tmp_path / "MGD999.yaml").write_text(ENTRY.format(sig=sig))
    return load_catalog(tmp_path)


def test_a_catastrophic_pattern_cannot_stall_explain(tmp_path):
    entries = _bad_catalog(tmp_path) + load_catalog()
    # distinct lines, each a million a's behind a trigger word: every one would take the
    # catastrophic pattern for ever without a time limit
    lines = [f"Error {word}: " + "a" * 1_000_000 for word in ("one", "two", "three", "four", "five", "six", "seven")]
    t0 = time.monotonic()
    report = explain_text("\n".join(lines) + "\n" + FAILING, entries)
    elapsed = time.monotonic() - t0
    assert elapsed < 20, f"{elapsed:.1f} s"
    assert report.diagnoses and report.diagnoses[0].code == "MGD601"


def test_a_pattern_that_times_out_is_left_out_for_the_rest_of_the_log(tmp_path):
    entries = _bad_catalog(tmp_path)
    matcher = Matcher(entries)
    calls = []
    pattern = matcher.slots[0].pattern
    original = Pattern.try_search
    try:
        Pattern.try_search = lambda self, text: calls.append(1) or original(self, text)
        for i in range(50):
            matcher.feed(LogLine(i + 1, "x" * i + "a" * 4000))
    finally:
        Pattern.try_search = original
    assert pattern.blind and len(calls) <= 3


def test_a_fuzzy_catastrophic_pattern_is_bounded_too(tmp_path):
    (tmp_path / "MGD999.yaml").write_text(ENTRY.format(sig="x").replace("- 'x'", "- {re: '(a|aa)+b', fuzzy: 2}"))
    entries = load_catalog(tmp_path)
    t0 = time.monotonic()
    explain_text("\n".join(f"Error {i}{'q' * i}: " + "a" * 200_000 for i in range(20)) + "\n", entries)
    assert time.monotonic() - t0 < 20


def test_host_prefix_check_is_linear():
    line = "a1" * 2000 + " no colon here"  # the old expression took ~0.3 s on this line
    t0 = time.perf_counter()
    for _ in range(100):
        split_rank(line)
    assert time.perf_counter() - t0 < 0.5
    assert split_rank("gpu-b1: [rank3]: ValueError: x") == (3, "ValueError: x")
    assert split_rank("10.0.0.2: RuntimeError: y") == (None, "RuntimeError: y")
    assert split_rank("train.py: line 3") == (None, "train.py: line 3")


def test_an_error_behind_a_million_rank_prefixes_is_found():
    log = FAILING.replace("[rank0]: AssertionError", "[rank0]:" * 1_000_000 + " AssertionError")
    [line] = normalise(3, log.splitlines()[2])
    assert line.rank == 0 and line.text.startswith("AssertionError: no_sync")
    report = explain_text(log)
    assert report.root_error is not None and report.root_error.text.startswith("AssertionError: no_sync")
    assert report.diagnoses[0].code == "MGD601"


def test_work_per_line_does_not_grow_with_the_catalog():
    entries = load_catalog()
    small, large = Matcher(entries), Matcher(entries * 10)
    inert = "Running the evaluation now, step twenty"  # no pattern's literals: no pattern looks at it
    assert small._prefilter.candidates(collapse(inert)) == large._prefilter.candidates(collapse(inert)) == []
    # a line costs the patterns whose literals it holds (here: ten copies of each), not the catalog
    warning = "/opt/site-packages/torch/utils/checkpoint.py:87: UserWarning: None of the inputs have requires_grad=True"
    assert len(large._prefilter.candidates(collapse(warning))) == 10 * len(small._prefilter.candidates(collapse(warning)))


def test_a_repeated_line_runs_the_catalog_once():
    matcher = Matcher(load_catalog())
    calls = []
    original = Pattern.try_search
    warning = "[rank3]:/opt/site-packages/torch/utils/checkpoint.py:87: UserWarning: None of the inputs have requires_grad=True"
    try:
        Pattern.try_search = lambda self, text: calls.append(1) or original(self, text)
        matcher.feed(LogLine(1, warning))
        first = len(calls)
        for i in range(2, 10_000):
            matcher.feed(LogLine(i, warning))
    finally:
        Pattern.try_search = original
    assert len(calls) == first


def test_the_reader_keeps_memory_bounded():
    reader = FailureReader()
    for i in range(20_000):  # a traceback opened by a different rank on every line, never closed
        reader.feed(LogLine(2 * i + 1, "Traceback (most recent call last):", rank=i))
        reader.feed(LogLine(2 * i + 2, '  File "train.py", line 3, in step', rank=i))
    assert len(reader._open) <= MAX_OPEN_TRACEBACKS
    for i in range(20_000):  # many errors, echoed without a traceback
        reader.feed(LogLine(10**6 + i, f"ValueError: bad sample {i}", rank=i % 8))
    assert len(reader.events) <= 8 * 256
    assert reader.finish().root is not None


def test_the_digit_literal_gate_keeps_the_same_slots(monkeypatch):
    """One search for all the digit-keeping literals of a shape's candidates (Matcher._gate)
    answers as each candidate's own literal test does."""
    texts = [f"json.decoder.JSONDecodeError: Expecting value: line 1 column {i % 77} (char {i})" for i in range(0, 40_000, 97)]
    texts += [f"GPU {i}: NVIDIA {name} sm_{i % 90} 100% | {i}/2950 err 29512"
              for i, name in enumerate(["V100", "T4", "A100", "H100", "RTX 2080", "L4", "A6000"] * 5)]
    texts += [f"exit code {i}" for i in range(0, 300, 7)] + [f"NCCL error {i}: unhandled" for i in range(8)]
    gated = Matcher(load_catalog())
    found = [gated.matching_slots(t) for t in texts]
    assert any(gated._gates.values())
    plain = Matcher(load_catalog())
    monkeypatch.setattr(plain, "_gate", lambda others: None)
    assert [plain.matching_slots(t) for t in texts] == found
