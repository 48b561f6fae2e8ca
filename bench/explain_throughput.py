#!/usr/bin/env python3
"""Throughput and peak memory of `mgft-doctor explain` on large synthetic logs shaped like real ones.

usage: python bench/explain_throughput.py [--sizes-mb 100,1000] [--shapes plain,warnings,...] [--keep DIR]

Every shape is what a long 8-rank ZeRO-3 run prints (progress redraws, loss dicts, INFO lines,
periodic warnings and NCCL INFO lines) with one habit of real logs made extreme, and every log
ends in the same real failure (a rank's traceback and torchrun's summary):

  plain       the lines above only (few trigger words)
  warnings    every step prints a UserWarning and its `warnings.warn(` source line
  progress    `\\r` progress redraws that carry a trigger word, 2,000 redraws per physical line
  ranks       8 ranks interleaved, every line behind its `[rankN]:` prefix, each rank warning each step
  tracebacks  handled (closed) tracebacks and cut-off (open) ones, each open one from a distinct rank
  longlines   100 kB tensor dumps holding a trigger word, and the failure's exception line behind
              10^6 rank prefixes (must still be found)

Prints MB/s and the peak RSS of the explain process per shape and size: throughput must not
fall and memory must stay flat as the log grows. The diagnosis column must read MGD601."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

FAILURE_HEAD = """[rank3]: Traceback (most recent call last):
[rank3]:   File "/opt/LLaMA-Factory/src/llamafactory/launcher.py", line 23, in <module>
[rank3]:     launch()
[rank3]:   File "/opt/conda/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 1997, in no_sync
[rank3]:     assert not self.zero_optimization_partition_gradients(), \\
"""
FAILURE_EXC = "[rank3]: AssertionError: no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage 3\n"
FAILURE_TAIL = """W0107 10:14:35.118000 7712 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7790 closing signal SIGTERM
E0107 10:14:35.533000 7712 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 3 (pid: 7791) of binary: /opt/conda/bin/python3.11
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  rank      : 3 (local_rank: 3)
  exitcode  : 1 (pid: 7791)
"""
FAILURE = FAILURE_HEAD + FAILURE_EXC + FAILURE_TAIL
EXPECTED = "MGD601"
WARNING = ("{p}/opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py:87: UserWarning: None of the inputs "
           "have requires_grad=True. Gradients will be None\n{p}  warnings.warn(\n")


def step_lines(rnd: random.Random, step: int, r: int, prefix: str = "") -> list[str]:
    """One rank's output for one training step (the 'plain' shape)."""
    p = prefix
    lines = [
        f"{p or f'[rank{r}]: '}{{'loss': {rnd.random() * 2:.4f}, 'grad_norm': {rnd.random():.4f}, 'learning_rate': 1.9e-05, 'epoch': {step / 1e5:.4f}}}",
        f"{p} {step % 100:3d}%|#####     | {step}/2000000 [01:53<7:01:44,  2.26s/it]\r {step % 100:3d}%|######    | {step + 1}/2000000 [01:54<7:01:40,  2.26s/it]",
        f"{p}[2025-01-07 10:{step % 60:02d}:11,062] [INFO] [logging.py:128:log_dist] [Rank {r}] step={step}, skipped=0, lr=[1.9e-05], mom=[(0.9, 0.999)]",
        f"{p}[INFO|trainer.py:2369] 2025-01-07 10:14:09,980 >> Saving model checkpoint to saves/ckpt-{step}" if step % 5000 == 0 else
        f"{p}[2025-01-07 10:{step % 60:02d}:11,063] [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/global_step={step // 8}, RunningAvgSamplesPerSec=31.4, CurrSamplesPerSec=30.9, MemAllocated=11.2GB, MaxMemAllocated=19.8GB",
    ]
    if step % 997 == 0:
        lines.append(f"{p or f'[rank{r}]:'}/opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py:87: UserWarning: None of the inputs have requires_grad=True. Gradients will be None")
    if step % 4999 == 0:
        lines.append(f"{p}gpu-box:7790:{7800 + r} [{r}] NCCL INFO Channel 0{r % 4}/0 : {r}[{r}] -> {(r + 1) % 8}[{(r + 1) % 8}] via P2P/CUMEM/read")
    return lines


def chunk_plain(rnd, step):
    return "\n".join(step_lines(rnd, step, step % 8)) + "\n"


def chunk_warnings(rnd, step):
    return chunk_plain(rnd, step) + WARNING.format(p=f"[rank{step % 8}]:")


def chunk_progress(rnd, step):
    if step % 20:
        return chunk_plain(rnd, step)
    base = (step // 20) * 2000
    redraws = "".join(f"\rFilter out samples with errors (num_proc=16): {i % 100:3d}%|####      | {base + i}/40000000 "
                      f"[00:{i % 60:02d}<03:12, {1000 + i % 997:.2f} examples/s]" for i in range(2000))
    return redraws + "\n"


def chunk_ranks(rnd, step):
    out = []
    for r in range(8):
        out += step_lines(rnd, step, r, prefix=f"[rank{r}]:")
        out.append(WARNING.format(p=f"[rank{r}]:").rstrip("\n"))
    return "\n".join(out) + "\n"


def chunk_tracebacks(rnd, step):
    text = chunk_plain(rnd, step)
    if step % 2:  # a handled error that the trainer logged with its traceback
        text += (f"[rank{step % 8}]: Traceback (most recent call last):\n"
                 f'[rank{step % 8}]:   File "/opt/app/data.py", line {step % 900 + 10}, in load_sample\n'
                 f"[rank{step % 8}]:     sample = json.loads(raw)\n"
                 f"[rank{step % 8}]: json.decoder.JSONDecodeError: Expecting value: line 1 column {step % 77} (char {step})\n")
    else:  # a traceback cut off (the rank was killed): it never gets its exception line
        rank = 100 + step  # every one from a rank of its own: the reader must not keep them all
        text += (f"[rank{rank}]: Traceback (most recent call last):\n"
                 f'[rank{rank}]:   File "/opt/app/train.py", line {step % 900 + 10}, in step_{step}\n')
    return text


def chunk_longlines(rnd, step):
    text = chunk_plain(rnd, step)
    if step % 200 == 0:
        values = ", ".join(f"{rnd.random():.4f}" for _ in range(14_000))
        text += f"[rank{step % 8}]: grad check warning: tensor([[{values}]], device='cuda:{step % 8}')\n"
    return text


CHUNKS = {"plain": chunk_plain, "warnings": chunk_warnings, "progress": chunk_progress, "ranks": chunk_ranks,
          "tracebacks": chunk_tracebacks, "longlines": chunk_longlines}


def failure_for(shape: str) -> str:
    if shape == "longlines":  # the exception line of the root error behind a million rank prefixes
        return FAILURE_HEAD + "[rank3]:" * 1_000_000 + FAILURE_EXC[len("[rank3]:"):] + FAILURE_TAIL
    return FAILURE


def make_log(path: str, size_mb: int, shape: str = "plain", seed: int = 0) -> int:
    rnd = random.Random(seed)
    chunk = CHUNKS[shape]
    target = size_mb * 1_000_000
    written = 0
    step = 0
    with open(path, "w", encoding="utf-8") as f:
        buf = []
        while written < target:
            step += 1
            text = chunk(rnd, step)
            buf.append(text)
            written += len(text)
            if len(buf) >= 2000:
                f.write("".join(buf))
                buf.clear()
        f.write("".join(buf))
        tail = failure_for(shape)
        f.write(tail)
        written += len(tail)
    return written


# the explain command in a child that reports its own peak RSS: VmHWM of its own memory
# (ru_maxrss carries the forking parent's peak across fork/exec; RUSAGE_CHILDREN is the largest
# child so far)
_CHILD = ("import resource, sys\nfrom mgft_doctor.cli import main\nrc = main(sys.argv[1:])\n"
          "u = resource.getrusage(resource.RUSAGE_SELF)\n"
          "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
          "sys.stderr.write('MAXRSS_KB %s CPU_S %.3f\\n' % (hwm, u.ru_utime + u.ru_stime))\nsys.exit(rc)\n")


def run_explain(path: str) -> tuple[float, float, float, dict]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one `explain --json`, and its JSON."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, "explain", path, "--json"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    usage = next((line.split() for line in proc.stderr.splitlines() if line.startswith("MAXRSS_KB")), None)
    peak_kb, cpu = (int(usage[1]), float(usage[3])) if usage else (0, wall)
    out = json.loads(proc.stdout) if proc.stdout.strip() else {"error": proc.stderr.strip()[-300:]}
    return wall, cpu, peak_kb / 1024, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="100,1000")
    ap.add_argument("--shapes", default=",".join(CHUNKS), help="comma-separated: " + ", ".join(CHUNKS))
    ap.add_argument("--keep", help="directory to write the logs into (default: a temporary one, removed)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    shapes = [s for s in args.shapes.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or tmp
        os.makedirs(where, exist_ok=True)
        # MB/s from the wall clock, and from the CPU time of the explain process (what the code
        # costs when the machine is shared), both counting its start-up
        print(f"{'shape':>10} {'size MB':>8} {'wall s':>8} {'MB/s':>8} {'CPU s':>8} {'MB/s CPU':>9} "
              f"{'peak RSS MB':>12}  diagnosis")
        for shape in shapes:
            for size in sizes:
                path = os.path.join(where, f"{shape}-{size}MB.log")
                if not (args.keep and os.path.exists(path)):
                    make_log(path, size, shape)
                n = os.path.getsize(path)
                wall, cpu, peak_mb, out = run_explain(path)
                diag = (out.get("diagnoses") or [{}])[0].get("code", "none") if "error" not in out else out["error"]
                flag = "" if diag == EXPECTED else "  <- expected " + EXPECTED
                print(f"{shape:>10} {n / 1e6:8.0f} {wall:8.2f} {n / 1e6 / wall:8.1f} {cpu:8.2f} {n / 1e6 / cpu:9.1f} "
                      f"{peak_mb:12.1f}  {diag}{flag}", flush=True)
                if not args.keep:
                    os.remove(path)


if __name__ == "__main__":
    main()
