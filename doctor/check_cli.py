"""Arguments and entry point of `mgft-doctor check` (filled in with the probe framework)."""

from __future__ import annotations

from .errors import DoctorError


def add_check_arguments(p) -> None:
    p.add_argument("config", nargs="?", help="LLaMA-Factory train YAML or DeepSpeed JSON")


def run_check(args) -> int:
    raise DoctorError("check is not available yet")
