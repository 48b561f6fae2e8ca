"""What every probe can see: the options of this check, the facts gathered once (torch's view
of the GPUs, read by facts.py; nvidia-smi's), the results of the probes run so far, and the
user's run config."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from functools import cached_property

from ..errors import DoctorError
from .facts import FACTS_TIMEOUT_S, Facts, read_facts
from .probe import ProbeResult
from .topology import Topology, read_topology


@dataclass
class Options:
    nproc: int | None = None  # ranks for the multi-rank probes; default: visible GPUs, at least 2
    timeout: float = 300.0  # hard limit for each multi-rank run or build, seconds
    python: str = sys.executable  # the Python environment under examination
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    config: str | None = None  # LLaMA-Factory YAML or DeepSpeed JSON
    model: str | None = None  # model folder or hub id (zero3.model)
    deepspeed: str | None = None  # DeepSpeed JSON (overrides the one in the YAML)
    trust_remote_code: bool = False
    cache_dir: str = field(default_factory=lambda: os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "mgft-doctor"))
    inject_fault: dict | None = None  # tests only: make a worker rank hang or die

    @classmethod
    def from_env(cls, *, nproc: int | None = None, timeout: float = 300.0, python: str | None = None,
                 nnodes: int | None = None, node_rank: int | None = None, master_addr: str | None = None,
                 master_port: int | None = None, config: str | None = None, model: str | None = None,
                 deepspeed: str | None = None, trust_remote_code: bool = False) -> "Options":
        """Options as `mgft-doctor check` and the pytest plugin build them: what is not given is read
        from NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT as LLaMA-Factory reads them."""
        if nproc is not None and nproc < 1:
            raise DoctorError("--nproc must be at least 1")
        if not timeout > 0:
            raise DoctorError("--timeout must be positive")
        fault = os.environ.get("MGFT_DOCTOR_INJECT_FAULT")
        return cls(
            nproc=nproc, timeout=timeout, python=python or sys.executable,
            nnodes=nnodes if nnodes is not None else _env_int("NNODES", 1),
            node_rank=node_rank if node_rank is not None else _env_int("NODE_RANK", 0),
            master_addr=master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1",
            master_port=master_port if master_port is not None else _env_int("MASTER_PORT", None),
            config=config, model=model, deepspeed=deepspeed, trust_remote_code=trust_remote_code,
            inject_fault=json.loads(fault) if fault else None,
        )


def _env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        raise DoctorError(f"{name}={value!r} is not an integer")


class Context:
    def __init__(self, options: Options):
        self.options = options
        self.results: dict[str, ProbeResult] = {}

    @cached_property
    def facts(self) -> Facts:
        """torch's view of this machine, read once per context (a subprocess of the examined Python)."""
        return read_facts(self.options.python, FACTS_TIMEOUT_S)

    @cached_property
    def topology(self) -> Topology:
        return read_topology()

    @property
    def use_gpus(self) -> bool:
        return self.facts.gpu_count > 0 and bool(self.facts.raw.get("nccl_available"))

    @property
    def backend(self) -> str:
        return "nccl" if self.use_gpus else "gloo"

    @property
    def nproc(self) -> int:
        if self.options.nproc:
            return self.options.nproc
        return max(2, self.facts.gpu_count)

    @cached_property
    def run_config(self):
        """The user's run as the doctor reads it (YAML + DeepSpeed JSON), or None without --config."""
        from ..runconfig import load_run_config

        if not (self.options.config or self.options.deepspeed or self.options.model):
            return None
        return load_run_config(self.options.config, deepspeed=self.options.deepspeed, model=self.options.model)

    def fault_for(self, probe_id: str) -> dict | None:
        f = self.options.inject_fault
        return f if f and f.get("probe", probe_id) == probe_id else None
