"""`mgft-doctor check` on this machine, for real: the probes run torchrun with gloo (no GPU
here), and the faults the doctor must catch are produced for real (a rank that hangs or dies,
a port that is taken, too few devices, a tiny /dev/shm)."""

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from mgft_doctor.launch import worker_script
from mgft_doctor.probes import _codes

pytestmark = pytest.mark.slow


ALLREDUCE_WORKER = worker_script("allreduce")


def leftover_workers():
    """All-reduce ranks of this checkout still alive after the probe returned."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if ALLREDUCE_WORKER in ln]


def test_whole_check_on_this_machine(run_check):
    code, probes, err = run_check(timeout=900)
    assert code == 0, err
    for pid, p in probes.items():
        assert p["status"] in ("pass", "warn", "skip"), (pid, p)
        if p["status"] == "skip":
            assert p["summary"].startswith("skipped:"), p
    ar = probes["nccl.allreduce"]
    assert ar["status"] == "pass"
    assert ar["metrics"]["backend"] in ("gloo", "nccl")
    assert ar["metrics"]["world_size"] >= 2
    assert ar["metrics"]["busbw_GBps"] > 0
    # busbw follows nccl-tests' convention from the measured algbw
    n = ar["metrics"]["world_size"]
    assert ar["metrics"]["busbw_GBps"] == pytest.approx(ar["metrics"]["algbw_GBps"] * 2 * (n - 1) / n, rel=1e-3)
    assert not leftover_workers()


def test_rank_that_never_reaches_the_collective(run_check):
    fault = '{"probe": "nccl.allreduce", "rank": 1, "kind": "hang"}'
    t0 = time.monotonic()
    code, probes, _ = run_check("--only", "nccl.allreduce", "--timeout", "20",
                                env={"MGFT_DOCTOR_INJECT_FAULT": fault})
    took = time.monotonic() - t0
    p = probes["nccl.allreduce"]
    assert code == 1 and p["status"] == "fail"
    f = p["findings"][0]
    assert f["code"] == _codes.COLLECTIVE_HANG
    assert "rank 1 (at 'init_process_group')" in f["message"]  # the laggard is named first
    assert "waiting for it: rank 0" in f["message"]
    assert took < 20 + 30  # the time limit fired; the clean-up is bounded
    assert not leftover_workers()


def test_rank_that_dies(run_check):
    fault = '{"probe": "nccl.allreduce", "rank": 1, "kind": "die", "code": 17}'
    code, probes, _ = run_check("--only", "nccl.allreduce", "--timeout", "60", env={"MGFT_DOCTOR_INJECT_FAULT": fault})
    p = probes["nccl.allreduce"]
    assert code == 1 and p["status"] == "fail"
    f = p["findings"][0]
    assert f["code"] == _codes.RANK_DIED
    assert "rank 1 died with exit code 17" in f["message"]
    assert not leftover_workers()


def test_master_port_taken(run_check):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, probes, _ = run_check("--only", "nccl.allreduce", "--timeout", "60", "--master-port", str(port))
    p = probes["nccl.allreduce"]
    assert code == 1 and p["status"] == "fail"
    assert p["findings"][0]["code"] == _codes.PORT_IN_USE, p["findings"]


def test_cuda_visible_devices_fewer_than_nproc(run_check):
    code, probes, _ = run_check("--only", "gpu,nccl.allreduce", "--nproc", "2", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert code == 1
    g = probes["gpu.visible"]
    assert g["status"] == "fail" and g["findings"][0]["code"] == _codes.NPROC_GT_GPUS
    assert "CUDA_VISIBLE_DEVICES names 1 device" in g["findings"][0]["message"]
    assert probes["nccl.allreduce"]["status"] == "skip"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) to mount a private /dev/shm")
def test_docker_sized_dev_shm(tmp_path):
    """A 64 MB /dev/shm, as Docker gives by default, in a private mount namespace."""
    script = (f"mount -t tmpfs -o size=64m tmpfs /dev/shm && "
              f"{sys.executable} -m mgft_doctor --only nccl.shm --json")
    proc = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if "mount" in proc.stderr and proc.returncode != 1:
        pytest.skip(f"cannot mount a private tmpfs here: {proc.stderr.strip()[:200]}")
    import json

    p = json.loads(proc.stdout)["probes"][0]
    assert proc.returncode == 1 and p["status"] == "fail"
    assert p["findings"][0]["code"] == _codes.SHM_TOO_SMALL
    assert p["metrics"]["size_bytes"] == 64 << 20


def test_two_nodes_over_loopback(tmp_path):
    """Multi-node through torchrun's own rendezvous: two doctors, one per 'node', one rank each."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    env.pop("MGFT_DOCTOR_INJECT_FAULT", None)

    def start(node_rank):
        return subprocess.Popen([sys.executable, "-m", "mgft_doctor", "--only", "nccl.allreduce", "--json",
                                 "--nnodes", "2", "--node-rank", str(node_rank), "--nproc", "1",
                                 "--master-addr", "127.0.0.1", "--master-port", str(port), "--timeout", "120"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    nodes = [start(0), start(1)]
    import json

    outs = [n.communicate(timeout=300) for n in nodes]
    for n, (out, err) in zip(nodes, outs):
        assert n.returncode == 0, err[-2000:]
        p = json.loads(out)["probes"][0]
        assert p["status"] == "pass" and p["metrics"]["world_size"] == 2


def test_selection_and_bad_input(run_doctor, run_check, tmp_path):
    code, probes, _ = run_check("--only", "nccl.shm")
    assert list(probes) == ["nccl.shm"]
    code, probes, _ = run_check("--only", "gpu,nccl", "--skip", "nccl.allreduce,nccl.p2p")
    assert list(probes) == ["gpu.visible", "nccl.shm"]
    code, out, err = run_doctor("--only", "nosuch")
    assert code == 2 and "unknown probe id" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "train.yaml"
    bad.write_text("model_name_or_path: [unclosed\n")
    code, out, err = run_doctor(str(bad), "--only", "nccl.shm")
    assert code == 2 and "not valid YAML" in err and "Traceback" not in err
    code, out, err = run_doctor(str(tmp_path / "missing.yaml"))
    assert code == 2 and "no such file" in err
    code, out, err = run_doctor("--nproc", "0")
    assert code == 2
