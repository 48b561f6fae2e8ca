"""The probes, one module each, in the order the doctor runs them. A probe module exposes PROBE
(mgft_doctor.probe.Probe); rank-side workers live in probes/workers/ as plain scripts."""

from __future__ import annotations

import importlib

from mgft_doctor.probe import Probe

MODULES = (
    "gpu_visible",
    "nccl_shm",
    "nccl_p2p",
    "nccl_allreduce",
    "deepspeed_install",
    "deepspeed_ops",
    "versions_compat",
    "config_deepspeed",
    "config_memory",
    "config_zero3_guards",
    "zero3_model",
)


def all_probes() -> list[Probe]:
    out = []
    for name in MODULES:
        module = importlib.import_module(f"mgft_doctor.probes.{name}")
        out.append(module.PROBE)
    return out
