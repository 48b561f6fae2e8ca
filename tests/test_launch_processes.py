"""doctor/launch/processes.py without torch: the time limit, the token kill, the guard that
outlives a SIGKILLed doctor, the parent-death signal, the private TMPDIR. Every test plants the
case, shows the processes existed (marked by MGFT_TEST_MARK in their environment) and that none
is left afterwards, nor any folder of the run."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from launch_helpers import MARK_VAR, Sampler, gone_within, kill_marked, listing, marked_processes, new_mark, wait_until
from mgft_doctor.launch.processes import GRACE_S, TOKEN_VAR, Guard, private_tmp_env, run_limited

# A process tree like a build's: the command, and a child in a session of its own that ignores
# SIGTERM (ninja and the compilers are not in the command's process group either).
TREE = r'''
import os, signal, subprocess, sys, tempfile, time
ready = sys.argv[1]
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "time.sleep(10**6)"], start_new_session=True)
with open(os.path.join(tempfile.gettempdir(), "scratch.bin"), "wb") as f:
    f.write(b"x" * (1 << 20))
open(ready, "w").write(tempfile.gettempdir())
time.sleep(10**6)
'''

# The doctor's part, in a process of its own so that the test can interrupt or kill it.
DRIVER = r'''
import json, os, sys, uuid
cfg = json.loads(sys.argv[1])
if cfg["catch"]:
    from mgft_doctor.cli.ends import catch_signals
    catch_signals()
from mgft_doctor.launch.processes import TOKEN_VAR, run_limited
token = uuid.uuid4().hex
env = dict(os.environ, **{TOKEN_VAR: token})
with open(cfg["log"], "wb") as log:
    run_limited([sys.executable, cfg["tree"], cfg["ready"]], env, cfg["run_dir"], 600, token, log,
                orphan_dirs=(cfg["run_dir"],), tmpdir=os.path.join(cfg["run_dir"], "tmp"))
'''


@pytest.fixture
def mark():
    m = new_mark()
    yield m
    kill_marked(m)


def _env(mark: str, **extra) -> dict:
    env = dict(os.environ)
    env[MARK_VAR] = mark
    env.update(extra)
    return env


@pytest.mark.slow
def test_time_limit_kills_a_tree_that_ignores_sigterm_in_other_sessions(tmp_path, mark):
    tree = tmp_path / "tree.py"
    tree.write_text(TREE)
    token = uuid.uuid4().hex
    env = _env(mark, **{TOKEN_VAR: token})
    with Sampler(mark) as seen, open(tmp_path / "log", "wb") as log:
        code, timed_out, wall, _ = run_limited([sys.executable, str(tree), str(tmp_path / "ready")], env,
                                               tmp_path, 3.0, token, log)
    assert timed_out and code is not None
    assert seen.most >= 2  # the command and its child in another session
    assert wall < 3.0 + 2 * GRACE_S + 3
    assert marked_processes(mark) == []


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0.0])
def test_time_limit_must_be_finite_and_positive(tmp_path, bad):
    with pytest.raises(ValueError, match="finite"), open(tmp_path / "log", "wb") as log:
        run_limited([sys.executable, "-c", "pass"], dict(os.environ), tmp_path, bad, "t", log)


def test_private_tmp_keeps_the_inductor_cache_where_it_was(tmp_path):
    env = private_tmp_env({"TMPDIR": str(tmp_path), "USER": "someone"}, str(tmp_path / "run" / "tmp"))
    assert env["TMPDIR"] == env["TMP"] == env["TEMP"] == str(tmp_path / "run" / "tmp")
    assert os.path.isdir(env["TMPDIR"])
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path) + os.sep + "torchinductor_")
    mine = private_tmp_env({"TORCHINDUCTOR_CACHE_DIR": "/x"}, str(tmp_path / "t2"))
    assert mine["TORCHINDUCTOR_CACHE_DIR"] == "/x"


def test_guard_does_nothing_when_released_and_cleans_up_when_orphaned(tmp_path, mark):
    token = uuid.uuid4().hex
    folder = tmp_path / "run"
    folder.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                               env=_env(mark, **{TOKEN_VAR: token}), start_new_session=True)
    try:
        Guard.start(token, (str(folder),)).release(completed=True)
        assert sleeper.poll() is None and folder.is_dir()
        Guard.start(token, (str(folder),)).release(completed=False)
        assert sleeper.wait(timeout=10) is not None
        assert not folder.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def _start_driver(tmp_path, mark, catch: bool):
    (tmp_path / "tree.py").write_text(TREE)
    (tmp_path / "driver.py").write_text(DRIVER)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = {"catch": catch, "log": str(tmp_path / "log"), "tree": str(tmp_path / "tree.py"),
           "ready": str(tmp_path / "ready"), "run_dir": str(run_dir)}
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), json.dumps(cfg)], env=_env(mark),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert wait_until(lambda: (tmp_path / "ready").exists(), 60), driver.stderr.read() if driver.poll() else ""
    time.sleep(0.3)  # the grandchild is started before the ready file
    return driver, run_dir


@pytest.mark.slow
@pytest.mark.parametrize("sig, catch", [(signal.SIGINT, False), (signal.SIGTERM, True), (signal.SIGTERM, False),
                                        (signal.SIGKILL, False)],
                         ids=["sigint", "sigterm-caught", "sigterm-default", "sigkill"])
def test_doctor_interrupted_or_killed_mid_run_leaves_nothing(tmp_path, mark, sig, catch):
    """SIGINT / a caught SIGTERM: run_limited kills the tree on the way out. SIGTERM's default
    action and SIGKILL: the doctor dies on the spot; its child gets the parent-death signal and
    the guard kills the rest and removes the run's folder."""
    driver, run_dir = _start_driver(tmp_path, mark, catch)
    before = marked_processes(mark)
    assert len(before) >= 4, before  # driver, guard, command, its child in another session
    assert (tmp_path / "ready").read_text() == str(run_dir / "tmp")  # the run's own TMPDIR
    driver.send_signal(sig)
    driver.wait(timeout=60)
    doctor_cleaned = sig == signal.SIGINT or catch  # else the guard did, after the doctor died
    left = gone_within(mark, 1.0 if doctor_cleaned else 2 * GRACE_S + 2)
    assert left == [], left
    assert wait_until(lambda: not run_dir.exists(), 10), listing(run_dir)


def test_direct_child_gets_sigkill_when_the_doctor_dies(tmp_path, mark):
    """The parent-death signal alone (no guard): the kernel kills the launcher's child."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "from mgft_doctor.launch.processes import die_with_parent\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
        "                         start_new_session=True, preexec_fn=die_with_parent())\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(script)], env=_env(mark), stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert child in [pid for pid, _ in marked_processes(mark)]
    parent.kill()
    parent.wait()
    assert gone_within(mark, 3) == []


def test_a_run_still_working_at_the_limit_goes_on_and_an_idle_or_endless_one_is_stopped(tmp_path, monkeypatch):
    """busy_limit (deepspeed.ops' first JIT build): past the time limit a run that keeps using CPU
    goes on, up to busy_limit; one that sleeps (a hang, a wait on a lock) is stopped at the limit."""
    from mgft_doctor.launch import processes

    monkeypatch.setattr(processes, "BUSY_WINDOW_S", 1.0)
    monkeypatch.setattr(processes, "BUSY_MIN_CPU_S", 0.1)  # 2 loaded cores: a spinning process gets ~0.25 s/s

    def run(code: str, busy_limit: float):
        token = uuid.uuid4().hex
        with open(tmp_path / "log", "wb") as log:
            return run_limited([sys.executable, "-c", code], {**os.environ, TOKEN_VAR: token}, tmp_path, 1.0,
                               token, log, busy_limit=busy_limit)

    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < {}: pass\n"
    code, timed_out, wall, _ = run(spin.format(4), busy_limit=30)
    assert (code, timed_out) == (0, False) and wall >= 3.5
    code, timed_out, wall, _ = run("import time; time.sleep(60)", busy_limit=30)
    assert timed_out and wall < 1 + 1 + GRACE_S + 3
    code, timed_out, wall, _ = run(spin.format(60), busy_limit=3)
    assert timed_out and 3 <= wall < 3 + 1 + GRACE_S + 3
