"""How the doctor's process ends (doctor/cli/ends.py, doctor/__main__.py): a closed or full stdout,
an ASCII-only encoding, a closed stdin, bad numbers in options and environment, Ctrl-C and
SIGTERM during start-up. Each ends with a defined exit code and at most one line on stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAILED_LOG = str(ROOT / "tests" / "fixtures" / "ranks" / "r0_raises_r1_times_out.log")
DOCTOR = [sys.executable, "-m", "mgft_doctor"]
# what the console script that pip writes does with pyproject's entry point
CONSOLE = [sys.executable, "-c", "import sys; from mgft_doctor.__main__ import entry; sys.exit(entry())"]
OURS = (str(ROOT / "doctor"), str(ROOT / "probes"))


def _env(**extra) -> dict:
    env = dict(os.environ)
    env.pop("MGFT_DOCTOR_INJECT_FAULT", None)
    env.update(extra)
    return env


def _run(args, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([*DOCTOR, *args], stderr=subprocess.PIPE, text=True, env=kw.pop("env", _env()),
                          timeout=120, **kw)


@pytest.mark.parametrize("args", [["explain", FAILED_LOG], ["explain", "--json", FAILED_LOG],
                                  ["explain", "-v", FAILED_LOG, FAILED_LOG]], ids=["report", "json", "verbose"])
def test_stdout_whose_reader_is_gone_keeps_the_verdict(args):
    """A pipe whose reader has already left (`| head -1` at its most abrupt): exit 1, silence."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = _run(args, stdout=write_end)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (1, "")


def test_head_minus_one_keeps_the_verdict():
    proc = subprocess.run(["bash", "-c", f'"$@" explain {FAILED_LOG} | head -1 >/dev/null; exit ${{PIPESTATUS[0]}}',
                           "sh", *DOCTOR], stderr=subprocess.PIPE, text=True, env=_env(), timeout=120)
    assert (proc.returncode, proc.stderr) == (1, "")


@pytest.mark.parametrize("args, code", [(["explain", FAILED_LOG], 1), (["explain", "--json", FAILED_LOG], 1),
                                        (["codes"], 0)], ids=["report", "json", "codes"])
def test_full_disk_keeps_the_verdict(args, code):
    with open("/dev/full", "w") as full:
        proc = _run(args, stdout=full)
    assert (proc.returncode, proc.stderr) == (code, "")


def test_closed_stdout_keeps_the_verdict():
    proc = subprocess.run(["bash", "-c", f'"$@" explain {FAILED_LOG} >&-', "sh", *DOCTOR], stderr=subprocess.PIPE,
                          text=True, env=_env(), timeout=120)
    assert (proc.returncode, proc.stderr) == (1, "")


@pytest.mark.parametrize("encoding", ["ascii", "ascii:strict", "latin-1"])
def test_an_encoding_that_cannot_show_the_report(encoding):
    proc = _run(["explain", FAILED_LOG], env=_env(PYTHONIOENCODING=encoding))
    assert (proc.returncode, proc.stderr) == (1, "")
    assert "Training failed" in proc.stdout


def test_closed_stdin_is_bad_input():
    proc = subprocess.run(["bash", "-c", '"$@" explain - <&-', "sh", *DOCTOR], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["mgft-doctor: -: standard input is closed, there is nothing to read"]


@pytest.mark.parametrize("args", [["--timeout", "nan"], ["--timeout", "inf"], ["--timeout", "-1"], ["--timeout", "0"],
                                  ["--timeout", "1e12"], ["--nproc", "0"], ["--nproc", "-1"], ["--nproc", "100000"],
                                  ["--master-port", "70000"], ["--master-port", "-1"], ["--nnodes", "0"],
                                  ["--nnodes", "2", "--node-rank", "2"], ["--node-rank", "-1"]])
def test_bad_numbers_in_options(args):
    proc = _run(["check", "--only", "nccl.allreduce", *args], stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("mgft-doctor: "), proc.stderr


@pytest.mark.parametrize("name, value", [("NNODES", "abc"), ("NODE_RANK", "x"), ("MASTER_PORT", "99999"),
                                         ("MASTER_PORT", "http"), ("NNODES", "0"), ("NODE_RANK", "3")])
def test_bad_numbers_in_the_environment(name, value):
    proc = _run(["check", "--only", "nccl.allreduce"], env=_env(**{name: value}), stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], proc.stderr


def test_bad_world_size_for_fix(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}')
    proc = _run(["fix", str(ds)], env=_env(WORLD_SIZE="abc"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "mgft-doctor: WORLD_SIZE='abc' is not a number of GPUs (set a number, or pass --world-size)"]


def test_console_script_goes_through_the_startup_wrapper():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["mgft-doctor"] == "mgft_doctor.__main__:entry"


def _signal_during_startup(cmd, sig, delay: float) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([*cmd, "explain", FAILED_LOG], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=_env())
    time.sleep(delay)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, "", err)


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [DOCTOR, CONSOLE], ids=["python-m", "console-script"])
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
                         ids=["sigint", "sigterm"])
def test_signal_during_startup_prints_no_traceback_of_ours(cmd, sig, code, word):
    """From the first line of the doctor's code on, a signal gives one line and 130 / 143. Before
    it (Python's own start-up: site, the .pth of an editable install) Python's behaviour stays:
    nothing of ours can run there, so a traceback may name only Python's files."""
    ours = 0
    for i in range(24):
        res = _signal_during_startup(cmd, sig, delay=i * 0.015)
        assert not any(path in res.stderr for path in OURS), res.stderr
        if res.returncode == code:
            ours += 1
            assert res.stderr == f"mgft-doctor: {word}\n"
        else:
            assert res.returncode in (1, -sig), (res.returncode, res.stderr)  # finished, or before Python ran us
    assert ours >= 3  # the signal did arrive while the doctor's code ran
