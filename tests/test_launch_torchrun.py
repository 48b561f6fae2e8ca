"""Multi-rank runs end within their limits whatever the ranks do, and leave nothing: no process
of the run (found by MGFT_TEST_MARK in its environment) and no folder in the temporary
directory (torchrun's torchelastic_* folder included: the ranks' TMPDIR is inside the run's
folder). The ranks are small worker scripts that speak the launcher's file protocol."""

from __future__ import annotations

import os
import sys
import tempfile
import time

import pytest

from launch_helpers import FAULT_WORKER, MARK_VAR, Sampler, kill_marked, listing, marked_processes, new_mark
from mgft_doctor.launch.processes import GRACE_S
from mgft_doctor.launch.torchrun import launch

pytestmark = pytest.mark.slow

STARTUP_S = 60  # torchrun imports torch: seconds on a loaded 2-core machine


@pytest.fixture
def run(tmp_path, monkeypatch):
    """launch() with the test's worker, a temporary directory of the test's own (compared before
    and after) and a mark on every process; returns (result, most processes seen, seconds)."""
    worker = tmp_path / "fault_worker.py"
    worker.write_text(FAULT_WORKER)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    mark = new_mark()

    def _run(kinds: dict, nproc: int, timeout: float):
        assert listing(tmp) == [] and marked_processes(mark) == []
        t0 = time.monotonic()
        with Sampler(mark) as seen:
            res = launch(str(worker), nproc=nproc, timeout=timeout, python=sys.executable,
                         args={"kinds": kinds}, env={MARK_VAR: mark})
        took = time.monotonic() - t0
        assert marked_processes(mark) == [], "processes of the run outlived it"
        assert listing(tmp) == [], "the run left folders in the temporary directory"
        return res, seen, took

    yield _run
    kill_marked(mark)


def test_healthy_run_leaves_no_torchelastic_folder(run, tmp_path):
    res, seen, _ = run({"all": "ok"}, nproc=2, timeout=STARTUP_S + 60)
    assert res.ok, res.log[-2000:]
    assert seen.most >= 1
    tmpdirs = {r["tmp"] for r in res.results()}
    assert len(tmpdirs) == 1  # the ranks share one TMPDIR, inside the run's folder
    (rank_tmp,) = tmpdirs
    assert rank_tmp.startswith(str(tmp_path / "tmp" / "mgft-doctor-")) and rank_tmp.endswith(os.sep + "tmp")


def test_ranks_that_hang_ignore_sigterm_spawn_and_fill_their_temp_folder(run):
    """Four ranks, none of which ever answers: the time limit fires, SIGTERM is not enough for
    two of them (one ignores it, one's child in another session ignores it), the fourth has
    filled its temporary folder. All of it goes."""
    timeout = 12.0
    kinds = {"0": "sleep", "1": "ignore_sigterm", "2": "spawn", "3": "fill_tmp"}
    res, seen, took = run(kinds, nproc=4, timeout=timeout)
    assert res.timed_out and res.silent_ranks == [0, 1, 2, 3]
    assert seen.most >= 6, seen.commands  # torchrun, four ranks, the spawned child
    assert took < timeout + 2 * GRACE_S + 10
    filled = res.ranks[3].phases
    assert "filled" in filled or res.ranks[3].last_phase == "fill_tmp"


@pytest.mark.parametrize("death", ["segfault", "sigkill"])
def test_a_rank_that_dies_while_another_ignores_sigterm(run, death):
    """torchrun sees the death and stops the other rank, which ignores SIGTERM; torchrun's own
    wait (30 s) is longer than the limit: the limit still holds."""
    timeout = 15.0
    res, seen, took = run({"0": "ignore_sigterm", "1": death}, nproc=2, timeout=timeout)
    assert not res.ok and 1 in res.silent_ranks
    assert res.ranks[1].last_phase == death
    assert took < timeout + 2 * GRACE_S + 10
    assert seen.most >= 2
