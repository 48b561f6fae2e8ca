"""Single-process GPU peer-to-peer check: for each ordered pair, can_device_access_peer, then a
real device-to-device copy that is verified and timed. Arguments: {"size_mb": 64}. Prints a
PHASE line per copy and one JSON object after MARK."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _protocol import emit, phase, script_args  # noqa: E402

COPIES = 5


def copy_pair(torch, src, i: int, j: int) -> dict:
    """Peer access of GPU i to GPU j, and a verified, timed copy of src from i to j."""
    row = {"src": i, "dst": j, "can_access_peer": bool(torch.cuda.can_device_access_peer(i, j))}
    phase(f"copy GPU{i}->GPU{j}")
    try:
        dst = src.to(f"cuda:{j}")  # warm-up, and the correctness check
        torch.cuda.synchronize(i)
        torch.cuda.synchronize(j)
        row["correct"] = bool(torch.equal(dst.to(f"cuda:{i}"), src))
        t0 = time.perf_counter()
        for _ in range(COPIES):
            dst.copy_(src)
        torch.cuda.synchronize(i)
        torch.cuda.synchronize(j)
        row["GBps"] = src.numel() * 4 * COPIES / (time.perf_counter() - t0) / 1e9
    except Exception as exc:  # noqa: BLE001
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def main() -> None:
    size_mb = float(script_args().get("size_mb", 64))
    phase("import_torch")
    import torch

    n = torch.cuda.device_count()
    numel = int(size_mb * (1 << 20)) // 4
    pairs = []
    for i in range(n):
        src = torch.arange(numel, dtype=torch.float32, device=f"cuda:{i}")
        pairs += [copy_pair(torch, src, i, j) for j in range(n) if j != i]
    emit({"device_count": n, "pairs": pairs})


if __name__ == "__main__":
    main()
