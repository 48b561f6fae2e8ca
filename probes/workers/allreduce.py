"""Rank-side all-reduce: a correctness check, then timed all-reduces per message size.
NCCL on GPUs (one GPU per local rank), gloo on CPU. Reports per-size algbw and busbw
(busbw = algbw * 2(n-1)/n, as nccl-tests)."""

import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _protocol import Worker  # noqa: E402


def body(w: Worker) -> dict:
    a = w.args
    fault = a.get("fault") or {}
    if fault.get("rank") == w.rank and fault.get("kind") == "die":
        w.phase("dying")
        os._exit(int(fault.get("code", 17)))
    w.phase("import_torch")
    import torch
    import torch.distributed as dist

    backend = a.get("backend", "gloo")
    if backend == "nccl":
        torch.cuda.set_device(w.local_rank)
        device = torch.device("cuda", w.local_rank)
    else:
        device = torch.device("cpu")
    w.phase("init_process_group")
    dist.init_process_group(backend, timeout=timedelta(seconds=float(a.get("pg_timeout", 60))))
    n = dist.get_world_size()
    if fault.get("rank") == w.rank and fault.get("kind") == "hang":
        time.sleep(10_000)  # this rank never reaches the collective; its last phase stays init
    w.phase("correctness_all_reduce")
    probe = torch.full((1024,), float(w.rank + 1), device=device)
    dist.all_reduce(probe)
    expected = n * (n + 1) / 2
    correct = bool(torch.all(probe == expected).item())

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    for size_mb in a.get("sizes_mb", [1, 8, 32]):
        numel = int(size_mb * (1 << 20)) // 4
        t = torch.ones(numel, dtype=torch.float32, device=device)
        w.phase(f"all_reduce_{size_mb}MB")
        for _ in range(int(a.get("warmup", 2))):
            dist.all_reduce(t)
        sync()
        dist.barrier()
        iters = int(a.get("iters", 5))
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        sync()
        elapsed = (time.perf_counter() - t0) / iters
        # the slowest rank decides the collective's time
        slow = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(slow, op=dist.ReduceOp.MAX)
        elapsed = float(slow.item())
        nbytes = numel * 4
        algbw = nbytes / elapsed / 1e9
        rows.append({"size_bytes": nbytes, "time_s": elapsed, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * 2 * (n - 1) / n})
        del t
    w.phase("done")
    return {"backend": backend, "world_size": n, "correct": correct,
            "value": float(probe[0].item()), "expected": expected, "sizes": rows,
            "device": str(device), "torch": torch.__version__}


if __name__ == "__main__":
    Worker().run(body)
