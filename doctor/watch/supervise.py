"""The supervised run: start the user's command as they typed it (its own session, so the
doctor can stop its whole tree), keep the pass-through going, watch the stall clock and torch's
watchdog lines, forward Ctrl-C and SIGTERM, and end with the command's own exit code (124 when
the doctor stopped a stall, 130/143 after Ctrl-C/SIGTERM)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from ..errors import DoctorError
from ..launch.processes import TOKEN_VAR, kill_tree, processes_with_token
from .folder import RunFolder, make_run_folder, run_environment
from .pump import Pump
from .snapshot import Snapshot, progressed, take_snapshot

EXIT_STALL = 124
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
INTERRUPT_GRACE_S = 10.0
DRAIN_S = 3.0
PROGRESS_CHECK_S = 1.0
FORWARDED = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


@dataclass
class RunOptions:
    command: list[str]
    stall_s: float = 300.0
    log: str | None = None
    keep_running: bool = False


def terminal_like(out) -> tuple[int | None, int | None]:
    """A pty for the command's stdout when ours is a terminal, so it line-buffers and colours as it
    would there (no \\n -> \\r\\n translation: the log gets the bytes the program wrote)."""
    try:
        if not os.isatty(out.fileno()):
            return None, None
        import fcntl
        import pty
        import termios
        master, slave = pty.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.ONLCR
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl.ioctl(out.fileno(), termios.TIOCGWINSZ, b"\0" * 8))
        except OSError:
            pass
        return master, slave
    except (OSError, ValueError, AttributeError, ImportError):
        return None, None


def resolve_command(command: list[str]) -> str:
    """The executable the shell would run, or the shell's own error and exit code."""
    if not command:
        raise DoctorError("run: no command given (mgft-doctor run [options] -- CMD ...)")
    exe = shutil.which(command[0])
    if exe is None:
        if os.sep in command[0] and os.path.exists(command[0]):
            raise DoctorError(f"{command[0]}: Permission denied", EXIT_NOT_EXECUTABLE)
        raise DoctorError(f"{command[0]}: command not found", EXIT_NOT_FOUND)
    return exe


class Supervisor:
    def __init__(self, opts: RunOptions, folder: RunFolder, out, err):
        self.opts, self.folder, self.out, self.err = opts, folder, out, err
        self.token = uuid.uuid4().hex
        self.env, self.fr = run_environment(dict(os.environ), folder, TOKEN_VAR, self.token)
        self.signals: list[int] = []
        self.reported_silence: float | None = None
        self.watchdog_reported = False
        self.proc: subprocess.Popen | None = None
        self.pump: Pump | None = None

    def say(self, text: str) -> None:
        try:
            self.err.write(text.encode("utf-8", "replace"))
            self.err.flush()
        except (BrokenPipeError, ValueError):
            pass

    def start(self, exe: str) -> None:
        cmd = [exe] + self.opts.command[1:]
        self.folder.write_meta({"command": self.opts.command, "token": self.token, "pid": os.getpid(),
                                "stall_s": self.opts.stall_s, **self.fr, "started": time.time()})
        log = open(self.folder.log, "ab")
        master, slave = terminal_like(self.out)
        try:
            self.proc = subprocess.Popen(cmd, stdout=slave if slave is not None else subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=self.env, start_new_session=True)
        except OSError as exc:
            log.close()
            code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
            raise DoctorError(f"{self.opts.command[0]}: {exc.strerror or exc}", code)
        finally:
            if slave is not None:
                os.close(slave)
        stdout = master if master is not None else self.proc.stdout
        self.pump = Pump({"stdout": stdout, "stderr": self.proc.stderr}, log,
                         {"stdout": self.out, "stderr": self.err})

    def wait(self, seconds: float) -> None:
        """Sleep while keeping the output flowing."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.pump.pump(min(0.1, max(0.0, end - time.monotonic())))

    def run(self) -> int:
        """The main loop; returns the doctor's exit code."""
        while True:
            self.pump.pump(0.2)
            if self.signals:
                return self.interrupted()
            if self.proc.poll() is not None:
                return self.finished()
            reason = self.stall_reason()
            if reason and self.on_stall(reason) and not self.opts.keep_running:
                self.stop()
                self.say(f"mgft-doctor: the run was stopped after the stall (exit {EXIT_STALL}); "
                         f"log {self.folder.log}, dumps in {self.folder.root}\n")
                return EXIT_STALL

    def stall_reason(self) -> str | None:
        if self.pump.watchdog_line and not self.watchdog_reported:
            self.watchdog_reported = True
            return f"torch's watchdog reported a time-out ({self.pump.watchdog_line[:160]})"
        silent = self.pump.silent_for()
        if silent >= self.opts.stall_s and self.reported_silence != self.pump.last_output:
            self.reported_silence = self.pump.last_output
            return f"no output for {silent:.0f} s"
        return None

    def on_stall(self, reason: str) -> bool:
        """Dump and report; False when a second look shows the ranks still make progress."""
        from .report import render_stall, stall_json, write_stall_json

        t0 = time.monotonic()
        snap = take_snapshot(self, reason)
        if reason.startswith("no output"):
            self.wait(PROGRESS_CHECK_S)
            again = take_snapshot(self, reason)
            if progressed(snap, again):
                self.pump.last_output = time.monotonic()  # silent but moving: restart the clock
                self.reported_silence = None
                return False
            snap = again
        states, finding = snap.analyse()
        self.say(render_stall(reason, [s for s in states if s.proc.role != "top"] or states, finding,
                              self.folder.root, stopping=not self.opts.keep_running))
        data = stall_json(reason, states, finding, time.monotonic() - self.pump.last_output,
                          time.monotonic() - t0)
        write_stall_json(self.folder.root, data)
        return True

    def stop(self) -> int:
        """TERM, then KILL, every process of the run, output still flowing meanwhile."""
        result = []
        worker = threading.Thread(target=lambda: result.append(kill_tree(self.token, self.proc)), daemon=True)
        worker.start()
        while worker.is_alive():
            self.pump.pump(0.1)
        self.pump.drain(time.monotonic() + DRAIN_S)
        return result[0] if result else 0

    def interrupted(self) -> int:
        """Ctrl-C or SIGTERM: forward it to the run's process group, wait, then clean up."""
        sig = self.signals[0]
        self.say(f"\nmgft-doctor: {signal.Signals(sig).name}: forwarding it to the run, then stopping it\n")
        try:
            os.killpg(self.proc.pid, sig)
        except OSError:
            pass
        end = time.monotonic() + INTERRUPT_GRACE_S
        while self.proc.poll() is None and time.monotonic() < end and len(self.signals) < 2:
            self.pump.pump(0.1)
        self.stop()
        return FORWARDED.get(sig, 128 + sig)

    def finished(self) -> int:
        self.pump.drain(time.monotonic() + DRAIN_S)
        if processes_with_token(self.token):
            n = self.stop()
            if n:
                self.say(f"mgft-doctor: stopped {n} process(es) the command left running\n")
        code = self.proc.returncode
        code = 128 - code if code < 0 else code
        if code != 0:
            self.explain()
        return code

    def explain(self) -> None:
        from rich.console import Console

        from ..explain import explain_paths
        from ..explain.render import render

        self.pump.log.flush()
        self.say(f"\nmgft-doctor: the command exited with code {self.proc.returncode}; diagnosis of "
                 f"{self.folder.log}:\n")
        try:
            report = explain_paths([str(self.folder.log)])
        except DoctorError as exc:
            self.say(f"mgft-doctor: cannot read the log: {exc}\n")
            return
        render(report, Console(file=sys.stderr, highlight=False))
        sys.stderr.flush()

    def on_signal(self, signum, _frame) -> None:
        self.signals.append(signum)


def supervise(opts: RunOptions, out=None, err=None) -> int:
    """Run opts.command under the doctor's watch; returns the exit code to end with."""
    exe = resolve_command(opts.command)
    folder = make_run_folder(opts.log)
    sup = Supervisor(opts, folder, out or sys.stdout.buffer, err or sys.stderr.buffer)
    sup.say(f"mgft-doctor: running {' '.join(opts.command)}\nmgft-doctor: output also in {folder.log} "
            f"(stall limit {opts.stall_s:g} s; dumps in {folder.root})\n")
    previous = {s: signal.signal(s, sup.on_signal) for s in FORWARDED}
    try:
        sup.start(exe)
        return sup.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if sup.pump is not None:
            sup.pump.close()
        if sup.proc is not None and sup.proc.poll() is None:
            kill_tree(sup.token, sup.proc)
        shutil.rmtree(folder.sub("ctl"), ignore_errors=True)  # the ranks' FIFOs mean nothing now
