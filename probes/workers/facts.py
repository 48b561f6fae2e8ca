"""Facts about the Python under examination: torch and its CUDA view, read in a subprocess so
a broken driver or a hanging import cannot take the doctor with it. Prints one JSON object on
a line that starts with MARK (doctor/check/facts.py reads it)."""

import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _protocol import emit, phase  # noqa: E402


def device_facts(torch, i: int) -> dict:
    try:
        p = torch.cuda.get_device_properties(i)
        return {"index": i, "name": p.name, "total_memory": p.total_memory,
                "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
                "bf16": (p.major >= 8)}
    except Exception as exc:  # noqa: BLE001
        return {"index": i, "error": f"{type(exc).__name__}: {exc}"}


def torch_facts(torch, out: dict) -> None:
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["torch_file"] = torch.__file__
    out["distributed"] = torch.distributed.is_available()
    out["nccl_available"] = bool(torch.distributed.is_available() and torch.distributed.is_nccl_available())
    try:
        out["nccl_version"] = ".".join(str(x) for x in torch.cuda.nccl.version()) if torch.version.cuda else None
    except Exception:  # noqa: BLE001
        out["nccl_version"] = None
    phase("cuda")
    try:
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    except Exception as exc:  # noqa: BLE001
        available, count = False, 0
        out["cuda_error"] = f"{type(exc).__name__}: {exc}"
    out["cuda_available"] = available
    out["device_count"] = count
    out["devices"] = [device_facts(torch, i) for i in range(count)]


def collect() -> dict:
    """The facts (the shared worker, stack.py, calls this too)."""
    out = {"python": platform.python_version(), "executable": sys.executable,
           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    phase("import_torch")
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
    else:
        torch_facts(torch, out)
    return out


def main() -> None:
    emit(collect())


if __name__ == "__main__":
    main()
