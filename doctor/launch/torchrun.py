"""The one way the doctor starts several ranks: torchrun, a fresh temporary folder, a hard time
limit. On time-out or interruption the whole process tree is killed (processes.py) and the
ranks that never answered are named, with the last phase each reached. The ranks' TMPDIR is
inside the run's folder, so torchrun's torchelastic_* folder and whatever the ranks leave in
their temporary folder go with it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .processes import TOKEN_VAR, free_port, run_limited

LOG_TAIL = 60_000


@dataclass
class RankOutcome:
    rank: int
    result: dict | None  # the worker's result JSON, None if it never wrote one
    phases: list[str] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return self.result is not None

    @property
    def last_phase(self) -> str | None:
        return self.phases[-1] if self.phases else None


@dataclass
class LaunchResult:
    command: list[str]
    ranks: dict[int, RankOutcome]
    returncode: int | None
    timed_out: bool
    wall_s: float
    log: str  # torchrun's and the workers' stdout/stderr, tail
    leftover_killed: int = 0  # processes still alive after the run that the launcher had to kill

    @property
    def silent_ranks(self) -> list[int]:
        return sorted(r for r, o in self.ranks.items() if not o.answered)

    @property
    def failed_ranks(self) -> list[int]:
        return sorted(r for r, o in self.ranks.items() if o.answered and not o.result.get("ok", False))

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.silent_ranks and not self.failed_ranks and self.returncode == 0

    def results(self) -> list[dict]:
        return [o.result for _, o in sorted(self.ranks.items()) if o.result is not None]

    def describe_silence(self) -> str:
        """Which ranks never answered, the laggards first: a rank that stopped at an earlier phase
        than the others is the one they are all waiting for."""
        silent = self.silent_ranks
        if not silent:
            return ""
        depth = {r: len(self.ranks[r].phases) for r in silent}
        behind = [r for r in silent if depth[r] < max(depth.values())] or silent
        waiting = [r for r in silent if r not in behind]

        def where(r):
            phase = self.ranks[r].last_phase
            return f"rank {r} (at '{phase}')" if phase else f"rank {r} (never started)"

        text = ", ".join(where(r) for r in behind)
        if waiting:
            text += "; waiting for it: " + ", ".join(where(r) for r in waiting)
        return text


def launch(script: str, *, nproc: int, timeout: float, python: str, args: dict | None = None,
           nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1",
           master_port: int | None = None, env: dict[str, str] | None = None,
           keep_dir: str | None = None) -> LaunchResult:
    """Run `script` on nproc ranks of this node under torchrun; never longer than timeout seconds.
    The run's folder (rank files, log, the ranks' TMPDIR with torchelastic's folder) is removed
    however the launch ends: normally, by an exception or Ctrl-C here, by the guard if the doctor dies."""
    workdir = Path(tempfile.mkdtemp(prefix="mgft-doctor-"))
    try:
        return _launch_in(workdir, script, nproc=nproc, timeout=timeout, python=python, args=args, nnodes=nnodes,
                          node_rank=node_rank, master_addr=master_addr, master_port=master_port, env=env,
                          keep_dir=keep_dir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _launch_in(workdir: Path, script: str, *, nproc: int, timeout: float, python: str, args: dict | None,
               nnodes: int, node_rank: int, master_addr: str, master_port: int | None,
               env: dict[str, str] | None, keep_dir: str | None) -> LaunchResult:
    outdir = workdir / "out"
    outdir.mkdir()
    token = uuid.uuid4().hex
    port = master_port or free_port()
    cmd = [python, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--nnodes={nnodes}",
           f"--node_rank={node_rank}", f"--master_addr={master_addr}", f"--master_port={port}",
           "--max_restarts=0", "--monitor_interval=0.2", script, "--outdir", str(outdir),
           "--args", json.dumps(args or {})]
    run_env = dict(os.environ)
    run_env.update(env or {})
    run_env[TOKEN_VAR] = token
    run_env.setdefault("PYTHONUNBUFFERED", "1")
    run_env.setdefault("OMP_NUM_THREADS", "1")
    run_env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    tmpdir = None if env and "TMPDIR" in env else str(workdir / "tmp")  # a TMPDIR the caller chose stays
    log_path = workdir / "launcher.log"
    with open(log_path, "wb") as log:
        returncode, timed_out, wall, leftover = run_limited(cmd, run_env, workdir, timeout, token, log,
                                                            orphan_dirs=(str(workdir),), tmpdir=tmpdir)
    first = node_rank * nproc
    ranks = {r: _read_rank(outdir, r) for r in range(first, first + nproc)}
    text = log_path.read_bytes()[-LOG_TAIL:].decode("utf-8", "replace")
    if keep_dir:
        shutil.copytree(workdir, keep_dir, dirs_exist_ok=True,
                        ignore=lambda folder, names: ["tmp"] if Path(folder) == workdir else [])
    return LaunchResult(cmd, ranks, returncode, timed_out, wall, text, leftover)


def _read_rank(outdir: Path, rank: int) -> RankOutcome:
    result = None
    path = outdir / f"result-{rank}.json"
    if path.exists():
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            result = None
    phases_path = outdir / f"phase-{rank}.txt"
    phases = phases_path.read_text(encoding="utf-8").split() if phases_path.exists() else []
    return RankOutcome(rank, result, phases)
