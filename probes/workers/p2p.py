"""Single-process GPU peer-to-peer check: for each ordered pair, can_device_access_peer, then a
real device-to-device copy that is verified and timed. Prints one JSON object."""

import json
import sys
import time

import torch

size_mb = float(sys.argv[1]) if len(sys.argv) > 1 else 64
n = torch.cuda.device_count()
pairs = []
numel = int(size_mb * (1 << 20)) // 4
for i in range(n):
    src = torch.arange(numel, dtype=torch.float32, device=f"cuda:{i}")
    for j in range(n):
        if i == j:
            continue
        row = {"src": i, "dst": j, "can_access_peer": bool(torch.cuda.can_device_access_peer(i, j))}
        print(json.dumps({"progress": f"copy GPU{i}->GPU{j}"}), file=sys.stderr, flush=True)
        try:
            dst = src.to(f"cuda:{j}")  # warm-up, and the correctness check
            torch.cuda.synchronize(i)
            torch.cuda.synchronize(j)
            row["correct"] = bool(torch.equal(dst.to(f"cuda:{i}"), src))
            t0 = time.perf_counter()
            for _ in range(5):
                dst.copy_(src)
            torch.cuda.synchronize(i)
            torch.cuda.synchronize(j)
            row["GBps"] = numel * 4 * 5 / (time.perf_counter() - t0) / 1e9
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"
        pairs.append(row)
print(json.dumps({"device_count": n, "pairs": pairs}))
