"""What every probe can see: the options of this check, the facts gathered once (torch's view
of the GPUs, read by facts.py; nvidia-smi's), the results of the probes run so far, and the
user's run config."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from dataclasses import dataclass, field

from ..errors import DoctorError
from .facts import FACTS_TIMEOUT_S, Facts, facts_from, read_facts
from .probe import ProbeResult
from .topology import Topology, read_topology


@dataclass
class Options:
    nproc: int | None = None  # ranks for the multi-rank probes; default: one per visible GPU, 2 without
    timeout: float = 300.0  # hard limit for each multi-rank run or build, seconds
    # False (check without --timeout): a JIT build still compiling at the limit goes on (see
    # deepspeed.ops); True: every run stops at the limit
    hard_timeout: bool = True
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
    rehearse: bool = False  # rehearsal.run: the YAML in miniature through llamafactory-cli (only when asked)

    @classmethod
    def from_env(cls, *, nproc: int | None = None, timeout: float = 300.0, python: str | None = None,
                 nnodes: int | None = None, node_rank: int | None = None, master_addr: str | None = None,
                 master_port: int | None = None, config: str | None = None, model: str | None = None,
                 deepspeed: str | None = None, trust_remote_code: bool = False,
                 hard_timeout: bool = True) -> "Options":
        """Options as `mgft-doctor check` and the pytest plugin build them: what is not given is read
        from NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT as LLaMA-Factory reads them. Every number
        is checked (finite, in range): a bad one is one line and exit 2, never a run without a limit."""
        if nproc is not None and not 1 <= nproc <= 1024:
            raise DoctorError(f"--nproc must be at least 1 (and at most 1024), not {nproc}")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and 0 < timeout <= 86400):
            raise DoctorError(f"--timeout must be positive: a number of seconds up to 86400 (a day), not {timeout}")
        nnodes = nnodes if nnodes is not None else _env_int("NNODES", 1, "--nnodes")
        node_rank = node_rank if node_rank is not None else _env_int("NODE_RANK", 0, "--node-rank")
        master_port = master_port if master_port is not None else _env_int("MASTER_PORT", None, "--master-port")
        if not 1 <= nnodes <= 65536:
            raise DoctorError(f"--nnodes (or NNODES) must be between 1 and 65536, not {nnodes}")
        if not 0 <= node_rank < nnodes:
            raise DoctorError(f"--node-rank (or NODE_RANK) must be between 0 and {nnodes - 1} for {nnodes} node(s), "
                              f"not {node_rank}")
        if master_port is not None and not 0 <= master_port <= 65535:
            raise DoctorError(f"--master-port (or MASTER_PORT) must be a port number, 1 to 65535 (0: a free one), not {master_port}")
        fault = os.environ.get("MGFT_DOCTOR_INJECT_FAULT")
        return cls(
            nproc=nproc, timeout=timeout, hard_timeout=hard_timeout, python=python or sys.executable,
            nnodes=nnodes, node_rank=node_rank,
            master_addr=master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1",
            master_port=master_port,
            config=config, model=model, deepspeed=deepspeed, trust_remote_code=trust_remote_code,
            inject_fault=json.loads(fault) if fault else None,
        )


def _env_int(name: str, default: int | None, option: str = "") -> int | None:
    """The integer in environment variable `name` (default when unset or empty); anything else is
    one line naming the variable (and the option that overrides it)."""
    value = os.environ.get(name)
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        instead = f" (set a number, or pass {option})" if option else ""
        raise DoctorError(f"{name}={value!r} is not an integer{instead}") from None


class once:
    """functools.cached_property, computed once per context even when probes running side by side
    ask for it together (the facts are a subprocess of several seconds; the run config is read once).
    A value put in the instance's __dict__ beforehand is used as it is."""

    _guard = threading.Lock()

    def __init__(self, fn):
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        with self._guard:
            lock = obj.__dict__.setdefault("_once_" + self.name, threading.Lock())
        with lock:
            if self.name not in obj.__dict__:
                obj.__dict__[self.name] = self.fn(obj)
            return obj.__dict__[self.name]


class Context:
    def __init__(self, options: Options):
        self.options = options
        self.results: dict[str, ProbeResult] = {}
        self.planned: list = []  # the probes this check runs (runner.run_all says): who shares the worker

    def plan(self, probes) -> None:
        self.planned = list(probes)

    @once
    def shared(self):
        """The shared worker (shared.py), started at the first ask when a planned probe shares it
        and the facts are not known yet; None otherwise (each probe then starts its own worker)."""
        if "facts" in self.__dict__:
            return None  # given (a test, the pytest plugin's contexts): nothing to share them with
        parts = [p.shares(self) for p in self.planned if getattr(p, "shares", None) is not None]
        if not parts:
            return None
        from .shared import Limit, SharedWorker

        args: dict = {}
        limits = [Limit("facts", FACTS_TIMEOUT_S)]
        for more_args, more_limits in parts:
            args.update(more_args)
            limits += more_limits
        return SharedWorker(self.options.python, args, limits).start()

    def shared_section(self, name: str):
        """A section of the shared worker (a ScriptRun; without payload when it stopped or died in
        it), or None: no shared worker, or it never began that section."""
        worker = self.shared
        return worker.section(name) if worker is not None else None

    def close(self) -> None:
        """The end of the check: nothing of the shared worker outlives it."""
        worker = self.__dict__.get("shared")
        if worker is not None:
            worker.close()

    @once
    def facts(self) -> Facts:
        """torch's view of this machine, read once per context (a subprocess of the examined Python:
        the shared worker's first section when there is one)."""
        worker = self.shared
        if worker is None:
            return read_facts(self.options.python, FACTS_TIMEOUT_S)
        return facts_from(worker.section("facts"), FACTS_TIMEOUT_S)

    @once
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
        """Ranks for the multi-rank probes (DESIGN §3): one per visible GPU, all of them; two gloo
        ranks on the CPU when there is no GPU."""
        if self.options.nproc:
            return self.options.nproc
        return self.facts.gpu_count if self.use_gpus else 2

    @once
    def run_config(self):
        """The user's run as the doctor reads it (YAML + DeepSpeed JSON), or None without --config."""
        from ..runconfig import load_run_config

        if not (self.options.config or self.options.deepspeed or self.options.model):
            return None
        return load_run_config(self.options.config, deepspeed=self.options.deepspeed, model=self.options.model)

    def fault_for(self, probe_id: str) -> dict | None:
        f = self.options.inject_fault
        return f if f and f.get("probe", probe_id) == probe_id else None
