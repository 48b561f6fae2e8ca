"""Shared by the rank-side workers. Workers run as plain scripts in the Python under
examination (which need not have mgft-doctor installed), so they import nothing of ours.

Protocol with the launcher (doctor/launcher.py): the launcher passes --outdir; each rank writes
`phase-<rank>.txt` as it advances (so a hang can be located) and `result-<rank>.json` when done,
then passes a barrier and leaves with os._exit(0) (gloo may abort at interpreter exit)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


class Worker:
    def __init__(self) -> None:
        ap = argparse.ArgumentParser()
        ap.add_argument("--outdir", required=True)
        ap.add_argument("--args", default="{}", help="JSON object of probe arguments")
        ns, _ = ap.parse_known_args()
        self.outdir = ns.outdir
        self.args = json.loads(ns.args)
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.t0 = time.perf_counter()
        self._phases: list[tuple[str, float]] = []

    def phase(self, name: str) -> None:
        """Record that this rank reached `name` (the launcher reports the last phase of a rank that hangs)."""
        self._phases.append((name, round(time.perf_counter() - self.t0, 3)))
        path = os.path.join(self.outdir, f"phase-{self.rank}.txt")
        with open(path, "a", encoding="utf-8") as f:
            f.write(name + "\n")

    def finish(self, payload: dict, barrier=None) -> None:
        payload = dict(payload)
        payload.setdefault("ok", True)
        payload["rank"] = self.rank
        payload["phases"] = self._phases
        self._write(payload)
        try:
            if barrier is not None:
                barrier()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def fail(self, exc: BaseException) -> None:
        self._write({"ok": False, "rank": self.rank, "phases": self._phases,
                     "error_type": type(exc).__name__, "error": str(exc)[:4000],
                     "traceback": traceback.format_exc()[-8000:]})
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    def _write(self, payload: dict) -> None:
        path = os.path.join(self.outdir, f"result-{self.rank}.json")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(payload, f)
        os.replace(tmp, path)

    def run(self, body) -> None:
        """Call body(self) -> dict; any exception becomes this rank's failure report."""
        try:
            payload = body(self)
        except BaseException as exc:  # noqa: BLE001 - everything is reported to the launcher
            self.fail(exc)
        else:
            barrier = None
            try:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    barrier = dist.barrier
            except ImportError:
                pass
            self.finish(payload, barrier)
