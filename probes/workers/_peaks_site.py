"""The rehearsal's sitecustomize: copied as sitecustomize.py into a folder that goes first on the
rehearsal ranks' PYTHONPATH (the rehearsal is the doctor's own run, so instrumenting it changes
no user code). LLaMA-Factory logs no memory figures; each rank (a process whose LOCAL_RANK its
parent did not have) writes, at exit, its peak host memory (ru_maxrss) and, where CUDA was used,
torch.cuda.max_memory_allocated / max_memory_reserved, into peak-rank<R>-<pid>.json in the
folder MGFT_DOCTOR_PEAKS names; and whether the doctor's process token reached it.

Stdlib only; does nothing without MGFT_DOCTOR_PEAKS; then runs the sitecustomize it shadows."""

import os
import sys

PEAKS_VAR = "MGFT_DOCTOR_PEAKS"
SEEN_VAR = "MGFT_DOCTOR_PEAKS_SEEN"  # RANK/LOCAL_RANK of the nearest instrumented ancestor
TOKEN_VAR = "MGFT_DOCTOR_RUN"  # doctor/launch/processes.py's token (a test keeps them equal)


def _rank_label():
    rank, local = os.environ.get("RANK", ""), os.environ.get("LOCAL_RANK", "")
    if not local or os.environ.get(SEEN_VAR) == f"{rank}/{local}":
        return None  # not a rank, or a child of an instrumented rank (dataloader, datasets map)
    os.environ[SEEN_VAR] = f"{rank}/{local}"
    return rank or local


def _cuda_peaks():
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return {}
        dev = torch.cuda.current_device()
        return {"cuda_device": dev, "cuda_max_allocated": int(torch.cuda.max_memory_allocated(dev)),
                "cuda_max_reserved": int(torch.cuda.max_memory_reserved(dev))}
    except Exception as exc:  # never fail the rank's exit for a figure
        return {"cuda_error": f"{type(exc).__name__}: {exc}"[:200]}


def write_peaks(folder, rank):
    """This process's peaks as JSON (atomically: the doctor may read while a rank is killed)."""
    import json
    import resource

    record = {"rank": int(rank) if str(rank).isdigit() else rank, "pid": os.getpid(),
              "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "token": os.environ.get(TOKEN_VAR), **_cuda_peaks()}
    path = os.path.join(folder, f"peak-rank{rank}-{os.getpid()}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def _setup():
    folder = os.environ.get(PEAKS_VAR)
    if not folder or not os.path.isdir(folder):
        return
    rank = _rank_label()
    if rank is None:
        return
    import atexit

    atexit.register(write_peaks, folder, rank)


def _chain():
    """Run the next sitecustomize on sys.path (the user's or the distribution's), as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # imported by name from the copy, not as the workers' module
    try:
        _setup()
    except Exception as exc:  # never break the rank for the sake of a figure
        sys.stderr.write(f"mgft-doctor: rehearsal memory figures skipped: {type(exc).__name__}: {exc}\n")
    _chain()
