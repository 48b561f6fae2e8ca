"""Run a command with a hard time limit, and kill every process it started: each process the
doctor starts carries a token in its environment, so the whole tree is found even where
torchrun puts its workers in sessions of their own.

Nothing of a run may outlive the doctor, however it ends:
- a time-out, Ctrl-C or SIGTERM (which the CLI turns into KeyboardInterrupt): run_limited kills
  the tree on the way out;
- the doctor SIGKILLed: its direct child gets SIGKILL from the kernel (PR_SET_PDEATHSIG), and a
  guard process in a session of its own, waiting on a pipe only the doctor holds, sees the pipe
  close and kills the rest of the tree by token (torchrun's ranks, compilers, anything they
  started) and removes the run's folders.

Stdlib only; run as a script (`python -I -S processes.py --guard ...`) it is that guard."""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

TOKEN_VAR = "MGFT_DOCTOR_RUN"
GRACE_S = 5.0  # after SIGTERM, how long a process gets before SIGKILL
ORPHAN_GRACE_S = 2.0  # the same, when the doctor is gone and nobody reads the results
PR_SET_PDEATHSIG = 1
BUSY_WINDOW_S = 30.0  # past the time limit, a run with busy_limit is looked at this often
BUSY_MIN_CPU_S = 3.0  # CPU seconds its processes must have used in a window to count as working
_RELEASED = b"released\n"  # what the doctor tells its guard when the run ended cleanly


_RUNNING: dict[str, subprocess.Popen] = {}  # token -> the run's first process, while run_limited waits on it
_RUNNING_LOCK = threading.Lock()
_STOPPING = threading.Event()  # stop_all_runs was called: no new run starts until resume_runs


def stop_all_runs() -> int:
    """Kill every run that run_limited is waiting on, in any thread, and start no new one: how
    check's concurrent runner ends on Ctrl-C or SIGTERM (only the main thread is interrupted; the
    threads' runs end here, and their run_limited returns). Returns how many runs were stopped."""
    _STOPPING.set()
    with _RUNNING_LOCK:
        running = list(_RUNNING.items())
    for token, proc in running:
        kill_tree(token, proc)
    return len(running)


def resume_runs() -> None:
    _STOPPING.clear()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_limited(cmd: list[str], env: dict, cwd, timeout: float, token: str, log, *,
                orphan_dirs: tuple[str, ...] = (), tmpdir: str | None = None,
                busy_limit: float | None = None) -> tuple[int | None, bool, float, int]:
    """Run cmd in its own session with output to log; past timeout, or when interrupted, kill
    every process carrying the token (env must hold it). Returns (exit code, timed out, wall
    seconds, leftovers killed). Raises OSError when cmd cannot be started.

    busy_limit: a run still working at the time limit (its processes used CPU in the last
    BUSY_WINDOW_S, as a compiler does) goes on, up to busy_limit seconds in all; an idle one (a
    hang, a wait on a lock) is killed at timeout as always.

    orphan_dirs: folders the guard removes if the doctor dies mid-run (the caller removes them
    otherwise). tmpdir: a private temporary folder for the run (created here; TMPDIR, TMP and
    TEMP point at it), so what the run leaves there goes with the caller's folder."""
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive finite number of seconds, not {timeout!r}")
    if tmpdir is not None:
        env = private_tmp_env(env, tmpdir)
    t0 = time.perf_counter()
    guard = Guard.start(token, orphan_dirs)
    completed = False
    try:
        if _STOPPING.is_set():
            raise KeyboardInterrupt("the doctor is stopping")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True, preexec_fn=die_with_parent())
        with _RUNNING_LOCK:
            _RUNNING[token] = proc
        try:
            returncode, timed_out = _wait_or_kill(proc, timeout, token, busy_limit)
        finally:
            with _RUNNING_LOCK:
                _RUNNING.pop(token, None)
        leftover = kill_tree(token, None)  # children that outlived it (torchrun's workers have their own sessions)
        completed = True
    finally:
        guard.release(completed)
    return returncode, timed_out, time.perf_counter() - t0, leftover


def _wait_or_kill(proc: subprocess.Popen, timeout: float, token: str,
                  busy_limit: float | None = None) -> tuple[int | None, bool]:
    """Wait for proc; at the time limit (or busy_limit while it keeps working), and on any
    interruption (Ctrl-C, the CLI's SIGTERM, an error), kill its whole tree before going on."""
    t0 = time.monotonic()
    try:
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            pass
        used = cpu_seconds(token) if busy_limit is not None else 0.0
        while busy_limit is not None and time.monotonic() - t0 < busy_limit:
            try:
                return proc.wait(timeout=max(0.1, min(BUSY_WINDOW_S, busy_limit - (time.monotonic() - t0)))), False
            except subprocess.TimeoutExpired:
                now = cpu_seconds(token)
                if now - used < BUSY_MIN_CPU_S:
                    break  # idle: hung, not slow
                used = now
        kill_tree(token, proc)
        return proc.returncode, True
    except BaseException:
        kill_tree(token, proc)
        raise


def cpu_seconds(token: str, var: str = TOKEN_VAR) -> float:
    """CPU seconds used by the run's live processes and the children they reaped (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for pid in processes_with_token(token, var):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            continue
    return total / tick


def private_tmp_env(env: dict, tmpdir: str) -> dict:
    """env with TMPDIR, TMP and TEMP at tmpdir (created): torchrun's torchelastic_* folder, the
    compilers' scratch files and the ranks' own temporary files land there. The inductor cache
    stays where it would have been, so healthy runs keep their compiled kernels."""
    os.makedirs(tmpdir, exist_ok=True)
    out = dict(env)
    inductor_default = os.path.join(_tempdir_of(env), f"torchinductor_{_user_name()}")
    out.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_default)
    for name in ("TMPDIR", "TMP", "TEMP"):
        out[name] = tmpdir
    return out


def _tempdir_of(env: dict) -> str:
    for name in ("TMPDIR", "TEMP", "TMP"):
        if env.get(name) and os.path.isdir(env[name]):
            return env[name]
    return "/tmp" if os.path.isdir("/tmp") else os.getcwd()


def _user_name() -> str:
    import getpass
    import re

    try:
        name = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        name = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return re.sub(r'[\\/:*?"<>|]', "_", name)  # as torch._inductor names it


def die_with_parent():
    """A preexec_fn that makes the child get SIGKILL when the doctor (the thread that started it)
    dies, or None where prctl is not available (not Linux). Only the direct child: torchrun's
    ranks and a build's compilers are reached by the guard instead."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the doctor died between fork and prctl
            os._exit(1)

    return set_parent_death_signal


class Guard:
    """The watcher of one run: a process in a session of its own (Ctrl-C in the terminal and a
    kill of the doctor's process group do not reach it) that reads a pipe whose only writer is
    the doctor. 'released' then end of file: the run ended cleanly, nothing to do. End of file
    alone (the doctor died, even by SIGKILL, or was interrupted): kill the tree, remove the dirs."""

    def __init__(self, proc: subprocess.Popen | None, write_fd: int | None):
        self.proc = proc
        self._write_fd = write_fd

    @classmethod
    def start(cls, token: str, dirs: tuple[str, ...] = (), var: str = TOKEN_VAR) -> "Guard":
        """Start the guard; without one (cannot start a process) the run still goes on."""
        read_fd, write_fd = os.pipe()  # not inheritable: no child of the run holds the write end
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), "--guard", var, token,
                                     *[os.path.abspath(d) for d in dirs]],
                                    stdin=read_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError:
            os.close(write_fd)
            return cls(None, None)
        finally:
            os.close(read_fd)
        return cls(proc, write_fd)

    def release(self, completed: bool) -> None:
        """Tell the guard how the run ended and let it go; when the run did not complete, wait
        (bounded) until it has killed what is left, so nothing outlives the doctor."""
        if self._write_fd is None:
            return
        fd, self._write_fd = self._write_fd, None
        try:
            if completed:
                os.write(fd, _RELEASED)
        except OSError:
            pass
        finally:
            os.close(fd)
        try:
            self.proc.wait(timeout=1.0 if completed else 2 * ORPHAN_GRACE_S + 2.0)
        except subprocess.TimeoutExpired:
            pass  # it finishes on its own; it is in a session of its own


def guard_main(argv: list[str]) -> int:
    """The guard process: block until the doctor's pipe closes, then clean up unless released."""
    var, token, *dirs = argv
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    try:
        told = sys.stdin.buffer.read()
    except OSError:
        told = b""
    if told == _RELEASED:
        return 0
    kill_tree(token, None, var, grace=ORPHAN_GRACE_S)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return 0


def processes_with_token(token: str, var: str = TOKEN_VAR) -> list[int]:
    """PIDs of this user's processes whose environment carries var=token (Linux /proc)."""
    if not os.path.isdir("/proc"):
        return []
    needle = f"{var}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_tree(token: str, proc: subprocess.Popen | None, var: str = TOKEN_VAR, grace: float = GRACE_S) -> int:
    """TERM, then KILL, every process of the run; returns how many had to be signalled."""
    pids = set(processes_with_token(token, var))
    if proc is not None and proc.poll() is None:
        pids.add(proc.pid)
    signalled = len(pids)
    if not pids:
        return 0
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _signal_all(pids, sig)
        pids = _wait_gone(pids, proc, grace)
        if not pids:
            break
    if proc is not None:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    return signalled


def _signal_all(pids: set[int], sig: int) -> set[int]:
    """Send sig to each process and its process group (never the doctor's own group)."""
    own_group = os.getpgid(0)
    for pid in list(pids):
        try:
            group = os.getpgid(pid)
            if group != own_group:
                os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pids.discard(pid)
    return pids


def _wait_gone(pids: set[int], proc: subprocess.Popen | None, grace: float) -> set[int]:
    """The processes still alive after waiting up to grace seconds for them to go."""
    deadline = time.monotonic() + grace
    while True:
        if proc is not None:
            proc.poll()  # reap our own child, or it stays a zombie and looks alive
        alive = {p for p in pids if _alive(p)}
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


if __name__ == "__main__" and sys.argv[1:2] == ["--guard"]:
    raise SystemExit(guard_main(sys.argv[2:]))
