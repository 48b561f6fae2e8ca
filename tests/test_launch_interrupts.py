"""The doctor itself interrupted (Ctrl-C, SIGTERM) or killed (SIGKILL) while its ranks hang in an
all-reduce: one line and exit 130 / 143 (no traceback), and within seconds no process of the
run (marked by MGFT_TEST_MARK) and no folder in the temporary directory. The same for a
single-script run with a build-like process tree (ninja, compilers) under it."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from launch_helpers import MARK_VAR, gone_within, kill_marked, listing, marked_processes, new_mark, wait_until
from mgft_doctor.launch.processes import GRACE_S, ORPHAN_GRACE_S

pytestmark = pytest.mark.slow

HANG = json.dumps({"probe": "nccl.allreduce", "rank": 1, "kind": "hang"})


@pytest.fixture
def mark():
    m = new_mark()
    yield m
    kill_marked(m)


def _in_the_all_reduce(tmp) -> bool:
    """Rank 0 waits in the first all-reduce, rank 1 (the planted hang) never reaches it."""
    phases = glob.glob(os.path.join(tmp, "mgft-doctor-*", "out", "phase-0.txt"))
    return bool(phases) and "correctness_all_reduce" in open(phases[0], encoding="utf-8").read()


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated"),
                                             (signal.SIGKILL, -signal.SIGKILL, None)],
                         ids=["sigint", "sigterm", "sigkill"])
def test_doctor_stopped_mid_all_reduce_hang(tmp_path, mark, sig, code, word):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), MGFT_DOCTOR_INJECT_FAULT=HANG, **{MARK_VAR: mark})
    doctor = subprocess.Popen([sys.executable, "-m", "mgft_doctor", "check", "--only", "nccl.allreduce",
                               "--timeout", "300", "--json"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: _in_the_all_reduce(tmp), 120), "the ranks never reached the all-reduce"
        before = marked_processes(mark)
        assert len(before) >= 4, before  # the doctor, torchrun, two ranks
        doctor.send_signal(sig)
        out, err = doctor.communicate(timeout=60)
    finally:
        doctor.kill()
    assert doctor.returncode == code
    if word:
        assert err == f"mgft-doctor: {word}\n"  # one line, no traceback
        assert out == ""
        assert marked_processes(mark) == []  # already gone when the doctor exits
    else:
        assert gone_within(mark, 2 * ORPHAN_GRACE_S + 3) == []
    assert wait_until(lambda: listing(tmp) == [], 5), listing(tmp)


BUILD = r'''
import os, subprocess, sys, tempfile, time
# like ninja running two compilers: a shell with children, and one in a session of its own
subprocess.Popen(["sh", "-c", "sleep 1000 & sleep 1000 & wait"])
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "time.sleep(10**6)"], start_new_session=True)
print("MGFT-DOCTOR-PHASE build", flush=True)
open(os.environ["READY"], "w").close()
time.sleep(10**6)
'''

SCRIPT_DRIVER = r'''
import sys
from mgft_doctor.cli.ends import catch_signals
catch_signals()
from mgft_doctor.launch.script import run_script
run_script(sys.executable, sys.argv[1], {}, timeout=300)
'''


def _start_build(tmp_path, mark):
    """The doctor's part in a process of its own (with the CLI's signal handling) running a
    build-like script through run_script; returns it and the temporary directory it uses."""
    (tmp_path / "build.py").write_text(BUILD)
    (tmp_path / "driver.py").write_text(SCRIPT_DRIVER)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    ready = tmp_path / "ready"
    env = dict(os.environ, TMPDIR=str(tmp), READY=str(ready), **{MARK_VAR: mark})
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "build.py")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_until(ready.exists, 60)
    return driver, tmp


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_interrupt_during_a_build_leaves_no_process(tmp_path, mark, sig):
    driver, _ = _start_build(tmp_path, mark)
    try:
        wait_until(lambda: len(marked_processes(mark)) >= 6, 5)
        before = marked_processes(mark)
        assert len(before) >= 6, before  # driver, script, sh, two sleeps, the other-session child
        driver.send_signal(sig)
        driver.wait(timeout=2 * GRACE_S + 20)
    finally:
        driver.kill()
    assert marked_processes(mark) == []


@pytest.mark.xfail(strict=True, reason="doctor/launch/script.py removes its mkdtemp folder only after a normal "
                   "end (needs try/finally and orphan_dirs=/tmpdir= for run_limited; see the report)")
def test_interrupt_during_a_build_leaves_no_folder(tmp_path, mark):
    driver, tmp = _start_build(tmp_path, mark)
    try:
        driver.send_signal(signal.SIGINT)
        driver.wait(timeout=2 * GRACE_S + 20)
    finally:
        driver.kill()
    assert wait_until(lambda: listing(tmp) == [], 5), listing(tmp)
