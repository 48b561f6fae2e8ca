"""The wall time of `mgft-doctor check` (its default probes, no run config) against `accelerate
test` (accelerate's own smoke test of a distributed setup) on this machine. Target: check takes at
most half of accelerate test's time (ratio <= 0.5).

    python bench/check_wall.py [--python PY] [--accelerate PATH] [--repeats N] [--json]

accelerate test runs with the config `accelerate config default` would write: MULTI_GPU over the
visible GPUs, one process on one GPU, two MULTI_CPU processes without a GPU. Runs alternate (check, accelerate, check, ...) and
the median of each is taken; check's per-probe durations come from its --json object (the row
of the slowest repeat is shown too). A cold first repeat (a JIT build of a DeepSpeed op into the
doctor's cache) is shown as such: later repeats find the build in the cache."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
MAIN_BIN = Path("/work/main/.venv/bin")  # the training environment of this project's machines


def gpu_count(python: str) -> int:
    out = subprocess.run([python, "-c", "import torch; print(torch.cuda.device_count())"], capture_output=True,
                         text=True, timeout=120)
    try:
        return int(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


def accelerate_config(folder: Path, gpus: int) -> Path:
    """The config a user of this machine gets from `accelerate config default`, so accelerate test
    needs no questions: MULTI_GPU over the visible GPUs, one process on one GPU, two CPU processes
    (MULTI_CPU) without a GPU."""
    if gpus >= 2:
        kind, n, cpu = "MULTI_GPU", gpus, "false"
    elif gpus == 1:
        kind, n, cpu = "'NO'", 1, "false"
    else:
        kind, n, cpu = "MULTI_CPU", 2, "true"
    lines = ["compute_environment: LOCAL_MACHINE", f"distributed_type: {kind}", f"num_processes: {n}",
             "num_machines: 1", "machine_rank: 0", "main_training_function: main", "mixed_precision: 'no'",
             f"use_cpu: {cpu}", "rdzv_backend: static", "same_network: true",
             "main_process_ip: 127.0.0.1", "main_process_port: 29517", "gpu_ids: all"]
    path = folder / "accelerate_config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], env: dict, cwd: str, timeout: float) -> tuple[float, int, str, float]:
    """(wall seconds, exit code, stdout, CPU seconds of the command and every process it reaped:
    on a machine of few cores the wall time follows the CPU time, so both are shown)."""
    t0, cpu0 = time.perf_counter(), _children_cpu()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
        return time.perf_counter() - t0, p.returncode, p.stdout, _children_cpu() - cpu0
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, 124, "", _children_cpu() - cpu0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=str(MAIN_BIN / "python"), help="the training Python check examines")
    ap.add_argument("--accelerate", default=str(MAIN_BIN / "accelerate"))
    ap.add_argument("--doctor", default=str(HERE / ".venv" / "bin" / "mgft-doctor"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--serial", action="store_true",
                    help="also time check with MGFT_DOCTOR_SERIAL=1 (one probe at a time: the runner before concurrency)")
    ap.add_argument("--skip", default="", help="probe ids check skips (its --skip), e.g. deepspeed.ops on a box whose "
                                               "first JIT build outlasts the time limit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    doctor = args.doctor if os.path.exists(args.doctor) else shutil.which("mgft-doctor") or "mgft-doctor"
    env = dict(os.environ)
    env["PATH"] = f"{Path(args.accelerate).parent}{os.pathsep}{env.get('PATH', '')}"  # accelerate-launch beside it
    with tempfile.TemporaryDirectory(prefix="check-wall-") as tmp:
        cfg = accelerate_config(Path(tmp), gpu_count(args.python))
        check_s, serial_s, accel_s, rows = [], [], [], []
        check_cpu, accel_cpu = [], []
        for i in range(args.repeats):
            for label, times, extra in (("check", check_s, {}), ("check serial", serial_s, {"MGFT_DOCTOR_SERIAL": "1"})):
                if times is serial_s and not args.serial:
                    continue
                cmd = [doctor, "check", "--json", "--python", args.python] + (["--skip", args.skip] if args.skip else [])
                s, rc, out, cpu = timed(cmd, {**env, **extra}, tmp, args.timeout)
                times.append(s)
                if times is check_s:
                    check_cpu.append(cpu)
                try:
                    probes = json.loads(out)["probes"]
                    rows.append({p["id"]: round(p["duration_s"], 1) for p in probes if p.get("duration_s")})
                except (ValueError, KeyError):
                    rows.append({"exit": rc})
                print(f"{label} #{i + 1}: {s:.1f} s, CPU {cpu:.1f} s (exit {rc}); probes {rows[-1]}", file=sys.stderr)
            s, rc, _, cpu = timed([args.accelerate, "test", "--config_file", str(cfg)], env, tmp, args.timeout)
            accel_s.append(s)
            accel_cpu.append(cpu)
            print(f"accelerate test #{i + 1}: {s:.1f} s, CPU {cpu:.1f} s (exit {rc})", file=sys.stderr)
    check_m, accel_m = statistics.median(check_s), statistics.median(accel_s)
    result = {"check_s": [round(x, 1) for x in check_s], "accelerate_test_s": [round(x, 1) for x in accel_s],
              "check_median_s": round(check_m, 1), "accelerate_test_median_s": round(accel_m, 1),
              "ratio": round(check_m / accel_m, 2), "target_ratio": 0.5, "probes": rows,
              "check_serial_s": [round(x, 1) for x in serial_s],
              "check_cpu_s": [round(x, 1) for x in check_cpu], "accelerate_test_cpu_s": [round(x, 1) for x in accel_cpu],
              "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 1)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"mgft-doctor check: {check_m:.1f} s (median of {len(check_s)}: "
              f"{', '.join(f'{x:.1f}' for x in check_s)})")
        if serial_s:
            print(f"mgft-doctor check, one probe at a time: {statistics.median(serial_s):.1f} s "
                  f"({', '.join(f'{x:.1f}' for x in serial_s)}); ratio {statistics.median(serial_s) / accel_m:.2f}")
        print(f"accelerate test:   {accel_m:.1f} s ({', '.join(f'{x:.1f}' for x in accel_s)})")
        print(f"CPU seconds (all processes): check {statistics.median(check_cpu):.1f}, accelerate test "
              f"{statistics.median(accel_cpu):.1f}")
        print(f"ratio check / accelerate test: {result['ratio']:.2f} (target <= 0.5); "
              f"{result['cpus']} CPUs, load {result['load_1min']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
