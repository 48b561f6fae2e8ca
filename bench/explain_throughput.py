#!/usr/bin/env python3
"""Throughput and peak memory of `mgft-doctor explain` on large synthetic multi-rank logs.

usage: python bench/explain_throughput.py [--sizes-mb 100,1000] [--keep DIR]

Each log is what a long 8-rank ZeRO-3 run prints: progress redraws, loss dicts, INFO lines,
periodic warnings and NCCL INFO lines, interleaved across ranks, ending in a real failure
(a rank's traceback and torchrun's summary). Prints MB/s and peak RSS per size: memory must
stay flat as the log grows."""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

FAILURE = """[rank3]: Traceback (most recent call last):
[rank3]:   File "/opt/LLaMA-Factory/src/llamafactory/launcher.py", line 23, in <module>
[rank3]:     launch()
[rank3]:   File "/opt/conda/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 1997, in no_sync
[rank3]:     assert not self.zero_optimization_partition_gradients(), \\
[rank3]: AssertionError: no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage 3
W0107 10:14:35.118000 7712 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7790 closing signal SIGTERM
E0107 10:14:35.533000 7712 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 3 (pid: 7791) of binary: /opt/conda/bin/python3.11
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  rank      : 3 (local_rank: 3)
  exitcode  : 1 (pid: 7791)
"""


def make_log(path: str, size_mb: int, seed: int = 0) -> int:
    rnd = random.Random(seed)
    target = size_mb * 1_000_000
    written = 0
    step = 0
    with open(path, "w", encoding="utf-8") as f:
        buf = []
        while written < target:
            step += 1
            r = step % 8
            lines = [
                f"[rank{r}]: {{'loss': {rnd.random() * 2:.4f}, 'grad_norm': {rnd.random():.4f}, 'learning_rate': 1.9e-05, 'epoch': {step / 1e5:.4f}}}",
                f" {step % 100:3d}%|#####     | {step}/2000000 [01:53<7:01:44,  2.26s/it]\r {step % 100:3d}%|######    | {step + 1}/2000000 [01:54<7:01:40,  2.26s/it]",
                f"[2025-01-07 10:{step % 60:02d}:11,062] [INFO] [logging.py:128:log_dist] [Rank {r}] step={step}, skipped=0, lr=[1.9e-05], mom=[(0.9, 0.999)]",
                f"[INFO|trainer.py:2369] 2025-01-07 10:14:09,980 >> Saving model checkpoint to saves/ckpt-{step}" if step % 5000 == 0 else
                f"[2025-01-07 10:{step % 60:02d}:11,063] [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/global_step={step // 8}, RunningAvgSamplesPerSec=31.4, CurrSamplesPerSec=30.9, MemAllocated=11.2GB, MaxMemAllocated=19.8GB",
            ]
            if step % 997 == 0:
                lines.append(f"[rank{r}]:/opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py:87: UserWarning: None of the inputs have requires_grad=True. Gradients will be None")
            if step % 4999 == 0:
                lines.append(f"gpu-box:7790:{7800 + r} [{r}] NCCL INFO Channel 0{r % 4}/0 : {r}[{r}] -> {(r + 1) % 8}[{(r + 1) % 8}] via P2P/CUMEM/read")
            chunk = "\n".join(lines) + "\n"
            buf.append(chunk)
            written += len(chunk)
            if len(buf) >= 2000:
                f.write("".join(buf))
                buf.clear()
        f.write("".join(buf))
        f.write(FAILURE)
        written += len(FAILURE)
    return written


def run_explain(path: str) -> tuple[float, float, dict]:
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run([sys.executable, "-m", "mgft_doctor", "explain", path, "--json"],
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return wall, max(peak_kb, before) / 1024, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="100,1000")
    ap.add_argument("--keep", help="directory to write the logs into (default: a temporary one, removed)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or tmp
        os.makedirs(where, exist_ok=True)
        print(f"{'size':>8} {'wall s':>8} {'MB/s':>8} {'peak RSS MB':>12}  diagnosis")
        for size in sizes:
            path = os.path.join(where, f"synthetic-{size}MB.log")
            n = make_log(path, size)
            wall, peak_mb, out = run_explain(path)
            diag = (out.get("diagnoses") or [{}])[0].get("code", "none")
            print(f"{n / 1e6:8.0f} {wall:8.2f} {n / 1e6 / wall:8.1f} {peak_mb:12.1f}  {diag}", flush=True)
            if not args.keep:
                os.remove(path)


if __name__ == "__main__":
    main()
