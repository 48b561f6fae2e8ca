"""The cost of `mgft-doctor run` on a healthy run: steps/s of a small real training loop (a DDP
MLP on two gloo ranks under torchrun, logging a line every few steps like a trainer does),
with and without the doctor, runs alternated and the median of each taken. Target: < 1 %.

    python bench/run_overhead.py [--steps 400] [--repeats 3] [--nproc 2]

Prints the steps/s of each run, both medians and the overhead in percent (and --json for a
machine-readable line)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

LOOP = """
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
steps, warmup = int(sys.argv[1]), 20
x = torch.randn(32, 256)
for step in range(steps + warmup):
    if step == warmup:
        dist.barrier()
        t0 = time.perf_counter()
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
dist.barrier()
if rank == 0:
    print(f"STEPS_PER_S {steps / (time.perf_counter() - t0):.3f}", flush=True)
dist.destroy_process_group()
"""


def _torchrun() -> str:
    found = shutil.which("torchrun") or shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if not found:
        import torch
        found = shutil.which("torchrun", path=str(Path(torch.__file__).resolve().parents[4] / "bin"))
    if not found:
        raise SystemExit("torchrun not found")
    return found


def one_run(script: Path, steps: int, nproc: int, doctor: bool, env: dict) -> float:
    from mgft_doctor.launch.processes import free_port
    cmd = [_torchrun(), "--nproc_per_node", str(nproc), "--master_port", str(free_port()), str(script), str(steps)]
    if doctor:
        cmd = [sys.executable, "-m", "mgft_doctor", "run", "--"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    m = re.search(r"STEPS_PER_S ([\d.]+)", p.stdout)
    if p.returncode != 0 or not m:
        raise SystemExit(f"run failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return float(m.group(1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mgft-run-overhead-") as tmp:
        script = Path(tmp) / "loop.py"
        script.write_text(textwrap.dedent(LOOP), encoding="utf-8")
        env = dict(os.environ, OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(Path(tmp) / "cache"))
        plain, ours = [], []
        for i in range(a.repeats):
            for doctor, bucket in ((False, plain), (True, ours)) if i % 2 == 0 else ((True, ours), (False, plain)):
                bucket.append(one_run(script, a.steps, a.nproc, doctor, env))
                print(f"{'doctor' if doctor else 'plain '} run {i + 1}: {bucket[-1]:.2f} steps/s", flush=True)
    p, o = statistics.median(plain), statistics.median(ours)
    overhead = (p - o) / p * 100
    print(f"without mgft-doctor run: {p:.2f} steps/s (median of {len(plain)})")
    print(f"with    mgft-doctor run: {o:.2f} steps/s (median of {len(ours)})")
    print(f"overhead: {overhead:+.2f} %")
    if a.json:
        print(json.dumps({"plain_steps_per_s": plain, "doctor_steps_per_s": ours, "overhead_pct": round(overhead, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
