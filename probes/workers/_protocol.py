"""The one protocol between the doctor and its workers. Workers run as plain scripts in the Python
under examination (which need not have mgft-doctor installed), so they import nothing of ours:
a worker puts its own folder on sys.path and imports this module as a sibling.

- Arguments: `--args JSON` (an object), plus `--outdir DIR` for the multi-rank workers that
  torchrun starts (doctor/launch/torchrun.py).
- Single-process workers (doctor/launch/script.py): `phase(name)` prints a PHASE line as they
  advance (so a time-out can say what hung), `emit(payload)` prints the result, one JSON object
  on a line that starts with MARK (libraries print to stdout as well).
- Multi-rank workers (`Worker`): each rank appends to `phase-<rank>.txt` as it advances and
  writes `result-<rank>.json` when done, then passes a barrier and leaves with os._exit (gloo
  may abort at interpreter exit).
- Errors, both ways: `error_fields(exc)` gives error_type, error (the message) and traceback
  (its tail), cut to the given lengths."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

# doctor/launch/script.py reads the same two prefixes (tests/test_workers_protocol.py keeps them equal)
MARK = "MGFT-DOCTOR-RESULT "
PHASE = "MGFT-DOCTOR-PHASE "


def parse_argv(outdir_required: bool = False) -> argparse.Namespace:
    """`.args` (the --args JSON object, {} when not given) and `.outdir` (None when not given)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--outdir", required=outdir_required)
    ap.add_argument("--args", default="{}", type=json.loads, help="JSON object of probe arguments")
    ns, _ = ap.parse_known_args()
    return ns


def script_args() -> dict:
    """The --args object of a single-process worker."""
    return parse_argv().args


def phase(name: str) -> None:
    """Announce that this worker reached `name` (the doctor reports the last one on a time-out)."""
    print(PHASE + name, flush=True)


def emit(payload: dict) -> None:
    """Print the worker's result after MARK, after whatever the libraries still had buffered."""
    sys.stdout.flush()
    sys.stderr.flush()
    print(MARK + json.dumps(payload, default=str), flush=True)


def error_fields(exc: BaseException, error_chars: int = 4000, traceback_chars: int = 8000) -> dict:
    """An exception as the doctor reads it: its type, its message and the tail of its traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"error_type": type(exc).__name__, "error": str(exc)[:error_chars], "traceback": tb[-traceback_chars:]}


def leave(code: int) -> None:
    """Flush and exit at once, skipping interpreter shutdown (gloo may abort in it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Worker:
    """One rank of a multi-rank worker: its arguments, its phase file and its result file."""

    def __init__(self) -> None:
        ns = parse_argv(outdir_required=True)
        self.outdir = ns.outdir
        self.args = ns.args
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.t0 = time.perf_counter()
        self.phases: list[tuple[str, float]] = []

    def phase(self, name: str) -> None:
        """Record that this rank reached `name` (the launcher reports the last phase of a rank that hangs)."""
        self.phases.append((name, round(time.perf_counter() - self.t0, 3)))
        path = os.path.join(self.outdir, f"phase-{self.rank}.txt")
        with open(path, "a", encoding="utf-8") as f:
            f.write(name + "\n")

    def write_result(self, payload: dict) -> None:
        """Write result-<rank>.json atomically (the launcher may read it while the rank is killed)."""
        path = os.path.join(self.outdir, f"result-{self.rank}.json")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(payload, f)
        os.replace(tmp, path)

    def finish(self, payload: dict, barrier=None) -> None:
        payload = dict(payload)
        payload.setdefault("ok", True)
        payload["rank"] = self.rank
        payload["phases"] = self.phases
        self.write_result(payload)
        try:
            if barrier is not None:
                barrier()
        finally:
            leave(0)

    def fail(self, exc: BaseException) -> None:
        self.write_result({"ok": False, "rank": self.rank, "phases": self.phases, **error_fields(exc)})
        traceback.print_exception(type(exc), exc, exc.__traceback__)
        leave(1)

    def run(self, body) -> None:
        """Call body(self) -> dict; any exception becomes this rank's failure report."""
        try:
            payload = body(self)
        except BaseException as exc:  # noqa: BLE001 - everything is reported to the launcher
            self.fail(exc)
        else:
            self.finish(payload, distributed_barrier())


def distributed_barrier():
    """torch.distributed's barrier when a process group is up, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist.barrier if dist.is_available() and dist.is_initialized() else None
