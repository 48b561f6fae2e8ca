"""Run a command with a hard time limit, and kill every process it started: each process the
doctor starts carries a token in its environment, so the whole tree is found even where
torchrun puts its workers in sessions of their own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

TOKEN_VAR = "MGFT_DOCTOR_RUN"
GRACE_S = 5.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_limited(cmd: list[str], env: dict, cwd, timeout: float, token: str, log) -> tuple[int | None, bool, float, int]:
    """Run cmd in its own session with output to log; past timeout kill every process carrying
    the token (env must hold it). Returns (exit code, timed out, wall seconds, leftovers killed).
    Raises OSError when cmd cannot be started."""
    t0 = time.perf_counter()
    timed_out = False
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=cwd, start_new_session=True)
    try:
        returncode = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(token, proc)
        returncode = proc.returncode
    wall = time.perf_counter() - t0
    leftover = kill_tree(token, None)  # children that outlived it (torchrun's workers have their own sessions)
    return returncode, timed_out, wall, leftover


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


def kill_tree(token: str, proc: subprocess.Popen | None, var: str = TOKEN_VAR) -> int:
    """TERM, then KILL, every process of the run; returns how many had to be signalled."""
    pids = set(processes_with_token(token, var))
    if proc is not None and proc.poll() is None:
        pids.add(proc.pid)
    signalled = len(pids)
    if not pids:
        return 0
    own_group = os.getpgid(0)
    for sig in (signal.SIGTERM, signal.SIGKILL):
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
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()
            alive = {p for p in pids if _alive(p)}
            if not alive:
                break
            time.sleep(0.05)
        pids = {p for p in pids if _alive(p)}
        if not pids:
            break
    if proc is not None:
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    return signalled


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False
