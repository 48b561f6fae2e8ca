"""`mgft-doctor run` on real runs: two gloo ranks under torchrun, scripts written here. A rank
stuck in a function of its own is named with that function, a raising rank gets explain's
diagnosis and the run's exit code, a healthy run passes through untouched, and nothing of the
run outlives the doctor (Ctrl-C, SIGKILL)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
DOCTOR = [sys.executable, "-m", "mgft_doctor"]


def find_tool(name: str) -> str:
    """A console script of the stack under test: on PATH, beside this Python, or beside torch's."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        import torch
        found = shutil.which(name, path=str(Path(torch.__file__).resolve().parents[4] / "bin"))
    if not found:
        pytest.skip(f"{name} not found")
    return found


def run_env(tmp_path: Path) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    env["PATH"] = os.pathsep.join([str(Path(find_tool("torchrun")).parent), env.get("PATH", "")])
    return env


def torchrun(script: Path) -> list[str]:
    return [find_tool("torchrun"), "--nproc_per_node", "2", "--master_port", str(_free_port()), str(script)]


def _free_port() -> int:
    from mgft_doctor.launch.processes import free_port
    return free_port()


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def run_folder(stderr: str) -> Path:
    m = re.search(r"dumps in (\S+)\)", stderr)
    assert m, stderr
    return Path(m.group(1))


def leftovers(folder: Path) -> list[int]:
    from mgft_doctor.launch.processes import processes_with_token
    token = json.loads((folder / "run.json").read_text())["token"]
    return processes_with_token(token)


def wait_gone(folder: Path, seconds: float) -> list[int]:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        left = leftovers(folder)
        if not left:
            return []
        time.sleep(0.2)
    return leftovers(folder)


# MGFT_TEST_BACKEND=nccl runs the same scripts on GPUs (one per rank): the Flight Recorder path of NCCL
BACKEND = os.environ.get("MGFT_TEST_BACKEND", "gloo")
PRELUDE = """
import os, sys, time
import torch, torch.distributed as dist
backend = os.environ.get("MGFT_TEST_BACKEND", "gloo")
device = "cpu"
if backend == "nccl":
    device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    torch.cuda.set_device(device)
dist.init_process_group(backend)
rank = dist.get_rank()
t = torch.ones(2, device=device)
dist.all_reduce(t)
t.sum().item()
print(f"rank {rank} ready", flush=True)
"""


def test_a_rank_stuck_in_its_own_function_is_named_and_the_run_stopped(tmp_path):
    script = write(tmp_path, "stuck.py", PRELUDE + """
def wait_for_my_shards():
    while True:
        time.sleep(0.2)

if rank == 0:
    wait_for_my_shards()
dist.all_reduce(t)
t.sum().item()
print("never printed", flush=True)
""")
    t0 = time.monotonic()
    p = subprocess.run(DOCTOR + ["run", "--stall", "5", "--"] + torchrun(script), env=run_env(tmp_path),
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 124, p.stderr
    err = p.stderr
    assert re.search(r"rank 0 \(pid \d+\): in wait_for_my_shards \(.*stuck\.py:\d+\)", err), err
    assert re.search(rf"rank 1 \(pid \d+\): waits in {BACKEND}:all_reduce #2", err), err
    assert f"Rank 0 is not in {BACKEND}:all_reduce #2 that rank 1 waits in" in err
    assert "MGD301" in err and "mgft-doctor codes MGD301" in err
    folder = run_folder(err)
    stall = json.loads((folder / "stall.json").read_text())
    assert stall["outliers"] == [0] and stall["collective"]["seq"] == 2
    assert stall["silent_s"] < 5 + 6, stall  # the report comes right after the stall limit
    assert "rank 0 ready" in p.stdout and "never printed" not in p.stdout
    assert wait_gone(folder, 5) == []
    assert time.monotonic() - t0 < 120


def test_a_rank_that_raises_gets_explains_diagnosis_and_the_runs_exit_code(tmp_path):
    script = write(tmp_path, "oom.py", PRELUDE + """
if rank == 1:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 1 has a total capacity "
                                 "of 79.10 GiB of which 3.12 GiB is free.")
dist.all_reduce(t)
""")
    env = run_env(tmp_path)
    plain = subprocess.run(torchrun(script), env=env, capture_output=True, text=True, timeout=180)
    p = subprocess.run(DOCTOR + ["run", "--"] + torchrun(script), env=env, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == plain.returncode != 0, p.stderr
    folder = run_folder(p.stderr)
    from mgft_doctor.explain import explain_paths
    report = explain_paths([str(folder / "output.log")])
    assert report.failure and report.diagnoses
    code = report.diagnoses[0].code
    assert f"Most likely: {code}" in p.stderr, p.stderr
    assert "Training failed" in p.stderr and "CUDA out of memory" in p.stderr
    assert wait_gone(folder, 5) == []


def test_a_healthy_run_passes_through_and_exits_0(tmp_path):
    script = write(tmp_path, "ok.py", PRELUDE + """
for step in range(3):
    dist.all_reduce(t)
    print(f"rank {rank} step {step} sum {t.sum().item():.0f}", flush=True)
print(f"rank {rank} err line", file=sys.stderr, flush=True)
dist.destroy_process_group()
""")
    env = run_env(tmp_path)
    log = tmp_path / "my.log"
    p = subprocess.run(DOCTOR + ["run", "--log", str(log), "--"] + torchrun(script), env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    for rank in (0, 1):
        assert f"rank {rank} step 2 sum" in p.stdout
        assert f"rank {rank} err line" in p.stderr and f"rank {rank} err line" not in p.stdout
    text = log.read_text()
    assert "rank 1 step 2 sum" in text and "rank 0 err line" in text
    assert "mgft-doctor: output also in " + str(log) in p.stderr
    assert "stalled" not in p.stderr and "diagnosis" not in p.stderr
    assert p.stderr.count("mgft-doctor:") == 2  # the two start lines, nothing else of ours


def _start_stuck(tmp_path: Path, body: str = "", options: tuple = ()) -> tuple[subprocess.Popen, Path]:
    script = write(tmp_path, "sleepy.py", PRELUDE + body + """
while True:
    time.sleep(0.5)
""")
    p = subprocess.Popen(DOCTOR + ["run", "--stall", "600", *options, "--"] + torchrun(script),
                         env=run_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    end = time.monotonic() + 120
    while len(seen) < 2 and time.monotonic() < end:
        line = p.stdout.readline()
        if "ready" in line:
            seen.append(line)
    assert len(seen) == 2, "the ranks never started"
    runs = list((tmp_path / "cache" / "mgft-doctor" / "runs").iterdir())
    return p, runs[0]


def test_ctrl_c_is_forwarded_and_the_run_cleaned_up(tmp_path):
    p, folder = _start_stuck(tmp_path)
    assert leftovers(folder)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "SIGINT: forwarding it to the run" in err
    assert wait_gone(folder, 3) == []


def test_ranks_die_with_a_killed_doctor(tmp_path):
    p, folder = _start_stuck(tmp_path)
    assert len(leftovers(folder)) >= 3  # torchrun and its two ranks
    p.kill()
    p.wait(timeout=10)
    assert wait_gone(folder, 8) == []


WATCHDOG = """
if rank == 0:
    time.sleep(1)
    print("[rank0]:[E1201 10:00:00.000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog "
          "caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=2, NumelOut=2, "
          "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.", file=sys.stderr, flush=True)
else:
    dist.all_reduce(t)
    t.sum().item()
"""


def test_a_watchdog_line_reports_at_once_and_keep_running_leaves_the_run(tmp_path):
    p, folder = _start_stuck(tmp_path, WATCHDOG, ("--keep-running",))
    end = time.monotonic() + 60
    while not (folder / "stall.json").exists() and time.monotonic() < end:
        time.sleep(0.2)
    stall = json.loads((folder / "stall.json").read_text())
    assert stall["reason"].startswith("torch's watchdog reported a time-out"), stall
    assert stall["outliers"] == [0] and stall["collective"]["seq"] == 2
    time.sleep(1)
    assert p.poll() is None and len(leftovers(folder)) >= 3  # --keep-running: still there
    p.terminate()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert "--keep-running: the run goes on" in err and "SIGTERM: forwarding it to the run" in err
    assert wait_gone(folder, 3) == []
