"""The run folder of the doctor's own (~/.cache/mgft-doctor/runs/<time>-<pid>/) and the
environment the user's command runs in: their own, plus the instrumentation, never replacing a
variable they set themselves."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import InputError

WATCH_VAR = "MGFT_DOCTOR_WATCH"
DOCTOR_PID_VAR = "MGFT_DOCTOR_PID"
SIGNAL_VAR = "MGFT_DOCTOR_DUMP_SIGNAL"
FR_PREFIX_VAR = "MGFT_DOCTOR_FR_PREFIX"
TORCH_DEFAULT_TRACE_PREFIX = "/tmp/nccl_trace_rank_"  # where torch dumps when nobody said
# SIGUSR1/2 belong to SLURM and torchrun's --signals-to-handle; glibc keeps SIGRTMIN..+2 itself
DUMP_SIGNAL = signal.SIGRTMIN + 7
NCCL_TRACE_PREFIX = "nccl_trace_rank_"
NCCL_PIPE_PREFIX = "nccl_pipe_"
SUBFOLDERS = ("stacks", "fr", "procs", "ctl")
KEEP_RUNS = 20  # run folders kept under runs_home(); a --log file outside is never removed


@dataclass
class RunFolder:
    root: Path
    log: Path

    def sub(self, name: str) -> Path:
        return self.root / name

    @property
    def meta_path(self) -> Path:
        return self.root / "run.json"

    def write_meta(self, meta: dict) -> None:
        self.meta_path.write_text(json.dumps(meta, indent=1), encoding="utf-8")

    def read_meta(self) -> dict:
        try:
            return json.loads(self.meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}


def runs_home() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mgft-doctor" / "runs"


def make_run_folder(log_arg: str | None) -> RunFolder:
    """Create the run folder (the cache, else a temporary folder) and open-test the log path."""
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    try:
        root = runs_home() / stamp
        root.mkdir(parents=True, exist_ok=False)
        prune_runs(runs_home(), keep=KEEP_RUNS)
    except OSError:
        root = Path(tempfile.mkdtemp(prefix=f"mgft-doctor-run-{stamp}-"))
    for name in SUBFOLDERS:
        (root / name).mkdir(exist_ok=True)
    log = Path(log_arg).expanduser() if log_arg else root / "output.log"
    try:
        with open(log, "ab"):
            pass
    except OSError as exc:
        raise InputError(f"cannot write the log file {log}: {exc.strerror or exc}")
    return RunFolder(root, log)


def prune_runs(home: Path, keep: int) -> None:
    """Remove all but the newest keep run folders (their names sort by time)."""
    import shutil
    folders = sorted(p for p in home.iterdir() if p.is_dir() and p.name[:8].isdigit())
    for old in folders[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def sitecustomize_dir() -> str:
    """The folder holding only the rank-side sitecustomize.py (first on the run's PYTHONPATH)."""
    return str(resources.files("mgft_doctor.watch") / "rankside")


def run_environment(base: dict, folder: RunFolder, token_var: str, token: str) -> tuple[dict, dict]:
    """(environment for the command, the Flight Recorder settings in force) - the user's own
    values of any variable win."""
    env = dict(base)
    env[token_var] = token
    env[WATCH_VAR] = str(folder.root)
    env[DOCTOR_PID_VAR] = str(os.getpid())
    env[SIGNAL_VAR] = str(int(DUMP_SIGNAL))
    site = sitecustomize_dir()
    env["PYTHONPATH"] = site + (os.pathsep + base["PYTHONPATH"] if base.get("PYTHONPATH") else "")
    fr = folder.sub("fr")
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    # the trace file and buffer size have version-dependent names (torch warns about the old
    # ones): the rank side sets them, knowing its torch; we only say where
    trace_prefix = base.get("TORCH_FR_DUMP_TEMP_FILE") or base.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not trace_prefix:
        trace_prefix = env[FR_PREFIX_VAR] = str(fr / NCCL_TRACE_PREFIX)
    pipe_prefix = base.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    if not pipe_prefix:
        pipe_prefix = env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] = str(fr / NCCL_PIPE_PREFIX)
    return env, {"trace_prefix": trace_prefix, "pipe_prefix": pipe_prefix}
