"""The `mgft_ranks` fixture: a user's function on N ranks under the doctor's launcher.

The function is imported by module and qualified name on every rank (the worker
probes/workers/run_function.py), so it must be a top-level function of an importable module
(a test module is: its folder and this session's sys.path are handed to the ranks). The
launcher gives torchrun, a fresh temporary folder and a hard time limit; the ranks' output is
printed to the test's stdout (captured by pytest, read by the diagnosis); a failure names the
rank that raised, with its traceback, or the ranks that never answered."""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import dataclass

from .state import DoctorState

MARK_VAR = "MGFT_DOCTOR_RANKS"  # in every rank's environment: finds leftovers after an interrupt
BACKENDS = ("auto", "gloo", "nccl", "none")


class RanksFailed(Exception):
    """A multi-rank run of mgft_ranks failed: a rank raised, died or never answered."""


@dataclass
class RanksRun:
    """What the last mgft_ranks call did (mgft_ranks.last)."""

    function: str
    nproc: int
    backend: str
    wall_s: float
    log: str
    results: list


def _function_spec(fn) -> tuple[str, str, str | None]:
    __tracebackhide__ = True
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not callable(fn) or not module or not qualname:
        raise RanksFailed(f"mgft_ranks needs a function, got {fn!r}")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise RanksFailed(f"mgft_ranks imports the function by name on every rank: {module}.{qualname} is not "
                          "a top-level function; define it at module level")
    if module == "__main__":
        raise RanksFailed(f"mgft_ranks cannot import {qualname} from __main__ on the ranks; put it in a module")
    mod = sys.modules.get(module)
    file = getattr(mod, "__file__", None)
    return module, qualname, os.path.abspath(file) if file else None


def _sys_path() -> list[str]:
    out = []
    for p in sys.path:
        p = os.path.abspath(p or os.getcwd())
        if p not in out and os.path.isdir(p):
            out.append(p)
    return out


class RankRunner:
    def __init__(self, doctor: DoctorState):
        self.doctor = doctor
        self.last: RanksRun | None = None
        self._marks: list[str] = []

    def __call__(self, fn, nproc: int = 2, *, backend: str = "auto", timeout: float | None = None,
                 args=(), kwargs: dict | None = None, env: dict | None = None) -> list:
        __tracebackhide__ = True
        from ..launch import worker_script
        from ..launch.torchrun import launch

        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise RanksFailed(f"mgft_ranks: nproc must be an integer >= 1, got {nproc!r}")
        if backend not in BACKENDS:
            raise RanksFailed(f"mgft_ranks: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        timeout = float(timeout) if timeout is not None else self.doctor.timeout
        module, qualname, file = _function_spec(fn)
        name = f"{module}.{qualname}"
        payload = {"module": module, "qualname": qualname, "file": file, "sys_path": _sys_path(),
                   "backend": backend, "args": list(args), "kwargs": dict(kwargs or {}), "pg_timeout": timeout}
        try:
            json.dumps(payload)
        except (TypeError, ValueError) as exc:
            raise RanksFailed(f"mgft_ranks: args and kwargs go to the ranks as JSON: {exc}") from None
        mark = uuid.uuid4().hex
        self._marks.append(mark)
        run_env = {str(k): str(v) for k, v in (env or {}).items()}
        run_env[MARK_VAR] = mark
        try:
            res = launch(worker_script("run_function"), nproc=nproc, timeout=timeout, python=sys.executable,
                         args=payload, env=run_env)
        except BaseException:  # KeyboardInterrupt mid-run: the ranks live in their own sessions
            kill_marked(mark)
            raise
        results = res.results()
        used = next((r.get("backend") for r in results if r.get("backend")), backend)
        # the ranks' output, as if they had printed here: pytest captures it, the diagnosis reads it
        sys.stdout.write(f"mgft_ranks: {name} on {nproc} rank(s), backend {used}, {res.wall_s:.1f} s\n{res.log}")
        if res.log and not res.log.endswith("\n"):
            sys.stdout.write("\n")
        values = [r.get("value") for r in results]
        self.last = RanksRun(name, nproc, used, res.wall_s, res.log, values)
        if res.ok:
            return values
        raise RanksFailed(describe_failure(res, name, nproc, used, timeout))

    def cleanup(self) -> None:
        """Fixture teardown: no process of any run of this test may outlive it."""
        for mark in self._marks:
            kill_marked(mark)
        self._marks.clear()


def describe_failure(res, name: str, nproc: int, backend: str, timeout: float) -> str:
    head = f"{name} on {nproc} rank(s) ({backend})"
    if res.timed_out:
        answered = sorted(r for r, o in res.ranks.items() if o.answered)
        text = (f"{head} did not finish within the time limit of {timeout:g} s: no answer from "
                f"{res.describe_silence()}")
        if answered:
            text += f"; rank(s) {answered} returned"
        return text + ". Every process of the run was stopped."
    lines = [f"{head} failed (torchrun exit code {res.returncode}):"]
    for rank, o in sorted(res.ranks.items()):
        r = o.result
        if r is not None and not r.get("ok", True):
            lines.append(f"rank {rank} raised {r.get('error_type')}: {r.get('error', '')}")
            tb = _user_frames(r.get("traceback") or "")
            if tb:
                lines += ["  " + ln for ln in tb]
    if res.silent_ranks:
        lines.append(f"no result from {res.describe_silence()} (it died or was stopped: see the captured output)")
    return "\n".join(lines)


def _user_frames(tb: str) -> list[str]:
    """A rank's traceback without the frames of the doctor's worker (the user's code starts below them)."""
    from ..launch import workers_dir

    workers = str(workers_dir())
    out, skipping = [], False
    for line in tb.rstrip().splitlines():
        if line.startswith("  File "):
            skipping = workers in line
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            out.append(line)
    return out


def kill_marked(mark: str) -> int:
    """TERM, then KILL, this user's processes whose environment carries MARK_VAR=mark."""
    from ..launch.processes import kill_tree

    return kill_tree(mark, None, MARK_VAR)
