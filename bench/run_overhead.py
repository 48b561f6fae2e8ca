"""The cost of `mgft-doctor run` on a healthy run: steps/s of a small real training loop (a DDP
MLP on two gloo ranks under torchrun, logging a line every few steps like a trainer does),
with and without the doctor, runs alternated and the median of each taken. Target: < 1 %.

    python bench/run_overhead.py [--steps 1000] [--repeats 5] [--nproc 2] [--json]

Prints per run the steps/s and the ranks' CPU time per step (process_time over the loop, every
thread of the rank: the instrumentation's included), then both medians and the overhead in
percent of each, and the doctor's own CPU time over the run. On a shared machine the wall-clock
steps/s swing far more than 1 % between runs; the CPU time per step is the steadier figure."""

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
import time
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
        c0 = time.process_time()
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
dist.barrier()
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
if rank == 0:
    print(f"STEPS_PER_S {steps / wall:.3f} CPU_MS_PER_STEP {cpu / steps * 1000:.4f}", flush=True)
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


def _cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def one_run(script: Path, steps: int, nproc: int, doctor: bool, env: dict) -> tuple[float, float, float | None]:
    """(steps/s, rank CPU ms per step, the doctor's own CPU seconds or None)."""
    from mgft_doctor.launch.processes import free_port
    cmd = [_torchrun(), "--nproc_per_node", str(nproc), "--master_port", str(free_port()), str(script), str(steps)]
    if doctor:
        cmd = [sys.executable, "-m", "mgft_doctor", "run", "--"] + cmd
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        own = None
        while p.poll() is None:
            own = _cpu_seconds(p.pid) if doctor else None
            time.sleep(0.2)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    m = re.search(r"STEPS_PER_S ([\d.]+) CPU_MS_PER_STEP ([\d.]+)", stdout)
    if p.returncode != 0 or not m:
        raise SystemExit(f"run failed ({p.returncode}): {' '.join(cmd)}\n{stderr[-2000:]}")
    return float(m.group(1)), float(m.group(2)), own


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    runs: dict[bool, list[tuple]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="mgft-run-overhead-") as tmp:
        script = Path(tmp) / "loop.py"
        script.write_text(textwrap.dedent(LOOP), encoding="utf-8")
        env = dict(os.environ, OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(Path(tmp) / "cache"))
        for i in range(a.repeats):
            for doctor in ((False, True) if i % 2 == 0 else (True, False)):
                runs[doctor].append(one_run(script, a.steps, a.nproc, doctor, env))
                sps, cpu, _ = runs[doctor][-1]
                print(f"{'doctor' if doctor else 'plain '} run {i + 1}: {sps:8.2f} steps/s  {cpu:.3f} CPU ms/step",
                      flush=True)
    med = {d: (statistics.median(r[0] for r in runs[d]), statistics.median(r[1] for r in runs[d])) for d in runs}
    wall_pct = (med[False][0] - med[True][0]) / med[False][0] * 100
    cpu_pct = (med[True][1] - med[False][1]) / med[False][1] * 100
    own = [r[2] for r in runs[True] if r[2] is not None]
    print(f"without mgft-doctor run: {med[False][0]:.2f} steps/s, {med[False][1]:.3f} CPU ms/step (medians of {a.repeats})")
    print(f"with    mgft-doctor run: {med[True][0]:.2f} steps/s, {med[True][1]:.3f} CPU ms/step")
    print(f"overhead: {wall_pct:+.2f} % steps/s, {cpu_pct:+.2f} % rank CPU per step; "
          f"the doctor itself: {statistics.median(own) if own else float('nan'):.2f} CPU s per run")
    if a.json:
        print(json.dumps({"runs": {("doctor" if d else "plain"): runs[d] for d in runs},
                          "overhead_steps_pct": round(wall_pct, 2), "overhead_cpu_pct": round(cpu_pct, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
