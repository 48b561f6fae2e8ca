"""Shared by tests/test_launch_*.py: find every process of one test by a mark in its environment
(/proc, as the launcher finds a run by its token), sample them while a run goes on, and a
rank-side worker that misbehaves on request while speaking the launcher's file protocol
(phase-<rank>.txt as it goes, result-<rank>.json when done; probes/workers/_protocol.py)."""

from __future__ import annotations

import os
import threading
import time
import uuid

MARK_VAR = "MGFT_TEST_MARK"


def new_mark() -> str:
    return uuid.uuid4().hex


def marked_processes(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries MARK_VAR=mark."""
    needle = f"{MARK_VAR}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found.append((int(entry), f.read().replace(b"\0", b" ").decode("utf-8", "replace")[:200]))
        except (OSError, IndexError):
            continue
    return found


def wait_until(predicate, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def gone_within(mark: str, seconds: float) -> list[tuple[int, str]]:
    """The marked processes still alive after waiting up to `seconds` for all of them to go."""
    wait_until(lambda: not marked_processes(mark), seconds)
    return marked_processes(mark)


def kill_marked(mark: str) -> None:
    """A failed test must not leave its processes to the next one."""
    import signal

    for pid, _ in marked_processes(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class Sampler:
    """Counts the marked processes while a run goes on (the most seen at once), so a test shows
    the tree existed before it shows it is gone."""

    def __init__(self, mark: str):
        self.mark = mark
        self.most = 0
        self.commands: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            procs = marked_processes(self.mark)
            self.most = max(self.most, len(procs))
            self.commands.update(cmd for _, cmd in procs)


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


# A rank that does what args["kinds"][rank] (or args["kinds"]["all"]) says.
FAULT_WORKER = r'''
import argparse, json, os, signal, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--outdir", required=True)
ap.add_argument("--args", default="{}")
ns, _ = ap.parse_known_args()
args = json.loads(ns.args)
rank = int(os.environ.get("RANK", "0"))
kinds = args.get("kinds", {})
kind = kinds.get(str(rank), kinds.get("all", "ok"))


def phase(name):
    with open(os.path.join(ns.outdir, f"phase-{rank}.txt"), "a", encoding="utf-8") as f:
        f.write(name + "\n")


def result(payload):
    path = os.path.join(ns.outdir, f"result-{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(payload, f)
    os.replace(path + ".tmp", path)


phase(kind)
if kind == "ok":
    result({"ok": True, "rank": rank, "tmp": tempfile.gettempdir()})
    os._exit(0)
if kind == "segfault":
    os.kill(os.getpid(), signal.SIGSEGV)
if kind == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
if kind == "ignore_sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if kind == "spawn":  # like a build: a child in a session of its own that ignores SIGTERM too
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "time.sleep(10**6)"], start_new_session=True)
if kind == "fill_tmp":  # many files and megabytes in the rank's temporary folder, until stopped
    folder = tempfile.mkdtemp(prefix="fill-")
    for i in range(10**6):
        with open(os.path.join(folder, f"chunk-{i}"), "wb") as f:
            f.write(b"x" * (256 << 10))
        if i == 40:
            phase("filled")
        if i > 40:
            time.sleep(0.02)
phase("sleeping")
time.sleep(10**6)
'''
