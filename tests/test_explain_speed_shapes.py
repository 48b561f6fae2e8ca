"""The throughput bench's log shapes (bench/explain_throughput.py), small: every shape still ends
in its real failure, is read far faster than the 0.05-0.2 MB/s these shapes once ran at, and
keeps the explain process small. The figures for 100 MB and 1 GB come from the bench itself."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "explain_throughput.py"
MIN_CPU_MB_S = 1.0  # a floor against regressions of the 1000x kind (CPU includes ~1 s of start-up), not the target: the bench prints that
MAX_RSS_MB = 300


def _bench():
    spec = importlib.util.spec_from_file_location("explain_throughput", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["plain", "warnings", "progress", "ranks", "tracebacks", "longlines"])
def test_bench_shape_is_read_fast_and_small(tmp_path, shape):
    bench = _bench()
    path = tmp_path / f"{shape}.log"
    size = bench.make_log(str(path), 8, shape)
    wall, cpu, peak_mb, out = bench.run_explain(str(path))
    assert out.get("diagnoses") and out["diagnoses"][0]["code"] == bench.EXPECTED, out
    assert size / 1e6 / cpu >= MIN_CPU_MB_S, f"{shape}: {size / 1e6 / cpu:.1f} MB/s of CPU"
    assert peak_mb < MAX_RSS_MB, f"{shape}: {peak_mb:.0f} MB"
