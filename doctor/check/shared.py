"""The shared worker (probes/workers/stack.py): one interpreter of the examined Python that answers
the facts, deepspeed.install's examination and deepspeed.ops' builds in turn, where each used to
start an interpreter of its own that imported torch again (seconds of CPU each; on a machine of
two cores the check was CPU-bound). Each answer is a section, read here as soon as the worker
prints it, so each probe still gets its own payload, output, phases and duration, and its own
time limit:

- a section past its limit (counted from when the worker began it; sections of one group share
  one deadline from the group's first section) stops the worker, its whole process tree, as
  launch.run_limited stops a single worker; a section with busy_s goes on while the worker keeps
  using CPU (a compiler), up to busy_s, as launch.script.run_script's busy_limit does;
- the section the worker was in when it stopped or died gets a ScriptRun without payload (timed
  out, or the exit code and the output), which the probe judges as it judges its own worker's;
- a section it never began is None: the probe then runs its own worker, as before.

The worker runs through launch.processes.run_limited (its token, the guard that kills it if the
doctor dies, stop_all_runs on Ctrl-C), with its output on a pipe read line by line."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass

from ..launch import worker_script
from ..launch.processes import BUSY_MIN_CPU_S, BUSY_WINDOW_S, TOKEN_VAR, cpu_seconds, kill_tree, run_limited
from ..launch.script import LOG_TAIL, MARK, PHASE, ScriptRun
from ..text import strip_ansi

SECTION_PHASE = "section:"  # the worker's phase line when it begins a section (stack.py)
POLL_S = 0.2


@dataclass
class Limit:
    """The time limit of a section (a name ending in ':' covers every section of that prefix)."""

    name: str
    seconds: float
    busy_s: float | None = None
    group: str | None = None

    def covers(self, section: str) -> bool:
        return section == self.name or (self.name.endswith(":") and section.startswith(self.name))


class SharedWorker:
    def __init__(self, python: str, args: dict, limits: list[Limit], env: dict[str, str] | None = None,
                 script: str | None = None):
        self.python = python
        self.args = args
        self.limits = limits  # in the order the worker answers them; the first also covers its start-up
        self.command = [python, script or worker_script("stack"), "--args", json.dumps(args)]
        self.token = uuid.uuid4().hex
        self._env = dict(os.environ, **(env or {}))
        self._env[TOKEN_VAR] = self.token
        self._env.setdefault("PYTHONUNBUFFERED", "1")
        self._cond = threading.Condition()
        self._got: dict[str, ScriptRun] = {}
        self._begun: dict[str, float] = {}  # section -> when the worker began it
        self._group_start: dict[str, float] = {}
        self._current: str | None = None
        self._log: list[str] = []  # output since the last section's answer
        self._log_chars = 0
        self._phases: list[str] = []
        self._t0 = 0.0
        self.ended = False
        self.returncode: int | None = None
        self.stopped_at: str | None = None  # the section whose limit stopped the worker
        self.start_error: str | None = None
        self._threads: list[threading.Thread] = []

    # -- what the probes call ---------------------------------------------------------------------
    def asked(self, section: str) -> bool:
        return any(lim.covers(section) for lim in self.limits)

    def section(self, name: str) -> ScriptRun | None:
        """The section's answer once it comes; a payload-less run when the worker stopped or died
        in it; None when it was not asked for or the worker never began it."""
        if not self.asked(name):
            return None
        with self._cond:
            while name not in self._got and not self.ended:
                self._cond.wait(1.0)
            if name in self._got:
                return self._got[name]
            if self.start_error is not None and name == self.limits[0].name:
                return ScriptRun(self.command, None, False, 0.0, self.start_error, None)
            if name != self._current and not (self._current is None and name == self.limits[0].name):
                return None  # never begun
            begun = self._begun.get(name, self._t0)
            return ScriptRun(self.command, self.returncode, self.stopped_at == name, time.monotonic() - begun,
                             "\n".join(self._log), None, 0, list(self._phases))

    def start(self) -> "SharedWorker":
        self._t0 = time.monotonic()
        read_fd, write_fd = os.pipe()
        reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True, name="mgft-shared-read")
        runner = threading.Thread(target=self._run, args=(write_fd, reader), daemon=True, name="mgft-shared-run")
        watch = threading.Thread(target=self._watch, daemon=True, name="mgft-shared-limits")
        self._threads = [reader, runner, watch]
        for t in self._threads:
            t.start()
        return self

    def close(self) -> None:
        """Stop the worker if it still runs (nobody waits for what is left) and wait for its threads."""
        if not self.ended:
            kill_tree(self.token, None)
        for t in self._threads:
            t.join(timeout=30)

    # -- the threads --------------------------------------------------------------------------------
    def _run(self, write_fd: int, reader: threading.Thread) -> None:
        workdir = tempfile.mkdtemp(prefix="mgft-doctor-")
        outer = sum(lim.busy_s or lim.seconds for lim in self.limits) + 60.0  # each section has its own below
        try:
            rc, _, _, _ = run_limited(self.command, self._env, workdir, outer, self.token, write_fd,
                                      orphan_dirs=(workdir,))
        except OSError as exc:
            rc, self.start_error = None, f"cannot run {self.python}: {exc}"
        except BaseException:  # noqa: BLE001 - stopped (Ctrl-C): nothing more comes
            rc = None
        finally:
            os.close(write_fd)
            reader.join(timeout=30)
            shutil.rmtree(workdir, ignore_errors=True)
            with self._cond:
                self.returncode = rc
                self.ended = True
                self._cond.notify_all()

    def _read(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                self._line(strip_ansi(raw.decode("utf-8", "replace")).rstrip("\r\n"))

    def _line(self, line: str) -> None:
        now = time.monotonic()
        with self._cond:
            if line.startswith(PHASE):
                name = line[len(PHASE):].strip()
                if name.startswith(SECTION_PHASE):
                    section = name[len(SECTION_PHASE):]
                    self._current = section
                    self._begun[section] = now
                    lim = self._limit(section)
                    if lim is not None and lim.group is not None:
                        self._group_start.setdefault(lim.group, now)
                else:
                    self._phases.append(name)
            elif line.startswith(MARK):
                try:
                    answer = json.loads(line[len(MARK):])
                    section, payload = answer["section"], answer["payload"]
                except (ValueError, KeyError, TypeError):
                    self._keep(line)
                    return
                begun = self._begun.get(section, self._t0)
                self._got[section] = ScriptRun(self.command, 0, False, now - begun, "\n".join(self._log), payload,
                                               0, list(self._phases))
                self._log, self._log_chars, self._phases = [], 0, []
                self._cond.notify_all()
            else:
                self._keep(line)

    def _keep(self, line: str) -> None:
        self._log.append(line)
        self._log_chars += len(line) + 1
        while self._log_chars > LOG_TAIL and len(self._log) > 1:
            self._log_chars -= len(self._log.pop(0)) + 1

    def _limit(self, section: str | None) -> Limit | None:
        if section is None:
            return self.limits[0] if self.limits else None
        return next((lim for lim in self.limits if lim.covers(section)), None)

    def _watch(self) -> None:
        """Stop the worker when the section it is in passes its limit (and is not busy compiling)."""
        busy_mark: tuple[float, float] | None = None  # (when, CPU seconds then) past the limit
        watched = None
        while True:
            with self._cond:
                if self.ended:
                    return
                current = self._current
                if current is not None and current in self._got:
                    self._cond.wait(POLL_S)  # between sections
                    continue
                lim = self._limit(current)
                begun = (self._group_start.get(lim.group) if lim is not None and lim.group else None) \
                    or self._begun.get(current or "", self._t0)
            if current != watched:
                watched, busy_mark = current, None
            now = time.monotonic()
            if lim is not None and now - begun > lim.seconds:
                if lim.busy_s is not None and now - begun < lim.busy_s:
                    used = cpu_seconds(self.token)
                    if busy_mark is None:
                        busy_mark = (now, used)
                    elif now - busy_mark[0] >= BUSY_WINDOW_S:
                        if used - busy_mark[1] < BUSY_MIN_CPU_S:
                            self._stop(current)  # idle: hung, not slow
                            return
                        busy_mark = (now, used)
                else:
                    self._stop(current)
                    return
            with self._cond:
                self._cond.wait(POLL_S)

    def _stop(self, section: str | None) -> None:
        with self._cond:
            self.stopped_at = section or self.limits[0].name
            if section is None:
                self._current = self.stopped_at
        kill_tree(self.token, None)
