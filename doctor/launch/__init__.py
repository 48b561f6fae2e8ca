"""Every subprocess the doctor starts goes through this package (DESIGN.md §3 "one launcher"):
processes.py (time limits, the process-tree kill by token), torchrun.py (several ranks),
script.py (one worker script, MARK/PHASE protocol). Stdlib only."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .processes import TOKEN_VAR

__all__ = ["TOKEN_VAR", "worker_script", "workers_dir"]


def workers_dir() -> Path:
    """The folder of the rank-side worker scripts, right in a wheel and in a checkout alike."""
    return Path(str(resources.files("mgft_doctor.probes.workers")))


def worker_script(name: str) -> str:
    """Path of a rank-side worker script shipped in mgft_doctor.probes.workers."""
    return str(workers_dir() / f"{name}.py")
