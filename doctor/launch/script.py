"""Run one plain worker script in the examined Python with a hard time limit, for the probes
that need a single process (no torchrun): the script's whole process tree (compilers, ninja,
nvcc) carries the launcher's token, so a time-out kills all of it, and anything left behind
after a normal exit is killed too. The script prints one JSON object on a line that starts with
MARK (libraries print to stdout as well: DeepSpeed's accelerator warning, ninja's progress), and
may announce where it is with lines that start with PHASE, so a time-out can say what hung."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field

from ..text import strip_ansi
from .processes import TOKEN_VAR, run_limited

# the prefixes of probes/workers/_protocol.py, the workers' side of the protocol (a worker imports
# nothing of ours and the doctor side nothing of the workers', so each holds them; a test keeps them equal)
MARK = "MGFT-DOCTOR-RESULT "
PHASE = "MGFT-DOCTOR-PHASE "
LOG_TAIL = 200_000


@dataclass
class ScriptRun:
    command: list[str]
    returncode: int | None
    timed_out: bool
    wall_s: float
    log: str  # stdout and stderr together (tail)
    payload: dict | None  # the JSON the script printed after MARK, None if it printed none
    leftover_killed: int = 0
    phases: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.payload is not None


def bin_dir(python: str) -> str:
    """The examined environment's bin folder (where its ninja, torchrun and nvcc wheels put scripts)."""
    return os.path.dirname(os.path.abspath(python))


def run_script(python: str, script: str, args: dict, timeout: float, env: dict[str, str] | None = None,
               cwd: str | None = None, busy_limit: float | None = None) -> ScriptRun:
    """Run `python script --args JSON`; never longer than timeout seconds (busy_limit: longer
    while it keeps using CPU, see processes.run_limited)."""
    token = uuid.uuid4().hex
    run_env = dict(os.environ)
    run_env.update(env or {})
    run_env[TOKEN_VAR] = token
    run_env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [python, script, "--args", json.dumps(args)]
    workdir = cwd or tempfile.mkdtemp(prefix="mgft-doctor-")
    with tempfile.TemporaryFile() as log:
        try:
            returncode, timed_out, wall, leftover = run_limited(cmd, run_env, workdir, timeout, token, log,
                                                                busy_limit=busy_limit)
        except OSError as exc:
            return ScriptRun(cmd, None, False, 0.0, f"cannot run {python}: {exc}", None)
        log.seek(0, os.SEEK_END)
        size = log.tell()
        log.seek(max(0, size - LOG_TAIL))
        text = strip_ansi(log.read().decode("utf-8", "replace"))
    if cwd is None:
        shutil.rmtree(workdir, ignore_errors=True)
    payload = None
    kept: list[str] = []
    phases: list[str] = []
    for line in text.splitlines():
        if line.startswith(MARK):
            try:
                payload = json.loads(line[len(MARK):])
            except json.JSONDecodeError:
                pass
        elif line.startswith(PHASE):
            phases.append(line[len(PHASE):].strip())
        else:
            kept.append(line)
    return ScriptRun(cmd, returncode, timed_out, wall, "\n".join(kept), payload, leftover, phases)
