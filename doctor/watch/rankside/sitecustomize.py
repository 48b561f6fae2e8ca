"""Loaded by every Python process of a `mgft-doctor run` (its folder is put first on PYTHONPATH).

Stdlib only, imports nothing of mgft_doctor (it runs in the user's Python), and does nothing
unless MGFT_DOCTOR_WATCH names the run folder. In a rank (a process whose RANK/LOCAL_RANK its
parent did not have) and in the doctor's direct child it:
  - registers faulthandler on a real-time signal, writing all threads' stacks to stacks/;
  - starts one daemon thread that sleeps in poll() on the doctor's pidfd and a FIFO: the doctor
    dying kills this process (no orphans holding GPUs), a line on the FIFO dumps PyTorch's
    Flight Recorder into fr/;
  - writes procs/<pid>.json so the doctor knows whom it may signal.
Then it runs the sitecustomize that ours shadows, so the user's own still runs."""

import os
import sys

WATCH_VAR = "MGFT_DOCTOR_WATCH"
DOCTOR_PID_VAR = "MGFT_DOCTOR_PID"
SIGNAL_VAR = "MGFT_DOCTOR_DUMP_SIGNAL"
FR_PREFIX_VAR = "MGFT_DOCTOR_FR_PREFIX"
SEEN_VAR = "MGFT_DOCTOR_SEEN"  # RANK/LOCAL_RANK of the nearest instrumented ancestor
PR_SET_PDEATHSIG = 1


def _rank_vars():
    return os.environ.get("RANK", ""), os.environ.get("LOCAL_RANK", "")


def _role(doctor_pid):
    rank, local = _rank_vars()
    if local and f"{rank}/{local}" != os.environ.get(SEEN_VAR):
        return "rank"
    return "top" if os.getppid() == doctor_pid else None


def _die_with_parent():
    """The doctor's direct child dies with it (PR_SET_PDEATHSIG): the doctor forks from its main thread."""
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except Exception:
        pass


def _doctor_gone_waiter(doctor_pid):
    """A poll()-able fd that turns readable when the doctor exits (pidfd), or None."""
    try:
        return os.pidfd_open(doctor_pid)
    except (AttributeError, OSError):
        return None


def _kill_self():
    import signal
    import time
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(3)
    os.kill(os.getpid(), signal.SIGKILL)


def _dump_flight_recorder(folder, rank):
    """The Flight Recorder's entries as JSON (torch's own dump functions), one file per kind;
    rank<R>.done says this request was served (with or without torch.distributed)."""
    try:
        _write_traces(folder, rank)
    finally:
        with open(os.path.join(folder, f"rank{rank}.done"), "w") as f:
            f.write(str(os.getpid()))


def _write_traces(folder, rank):
    import json
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_initialized():
            return
        from torch._C import _distributed_c10d as c10d
    except Exception:
        return
    for kind in ("fr", "nccl"):
        fn = getattr(c10d, f"_dump_{kind}_trace_json", None)
        if fn is None:
            continue
        try:
            text = fn(includeCollectives=True)
            if isinstance(text, bytes):
                text = text.decode("utf-8", "replace")
            json.loads(text)
        except Exception:
            continue
        tmp = os.path.join(folder, f".rank{rank}.{kind}.json.{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, os.path.join(folder, f"rank{rank}.{kind}.json"))


def _serve(doctor_pid, pidfd, fifo_fd, fr_folder, rank):
    import select
    import time
    poller = select.poll()
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    if fifo_fd is not None:
        poller.register(fifo_fd, select.POLLIN)
    while True:
        events = poller.poll(None if pidfd is not None else 1000)
        if pidfd is None and not _alive(doctor_pid):
            _kill_self()
        for fd, _ in events:
            if fd == pidfd:
                _kill_self()
            elif fd == fifo_fd:
                try:
                    os.read(fifo_fd, 4096)
                except OSError:
                    time.sleep(0.1)
                    continue
                try:
                    _dump_flight_recorder(fr_folder, rank)
                except Exception:
                    pass


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _torch_version():
    try:
        from importlib.metadata import version
        major, minor = version("torch").split(".")[:2]
        return int(major), int(minor)
    except Exception:
        return None


def _flight_recorder_settings():
    """Point the Flight Recorder's own dump (watchdog time-out, dump pipe) at the run folder, by
    the variable name this torch reads without a deprecation warning; torch < 2.6 also needs
    its buffer turned on. The user's own settings are left alone."""
    prefix = os.environ.get(FR_PREFIX_VAR)
    version = _torch_version()
    if not prefix or version is None:
        return
    new_names = version >= (2, 7)
    if "TORCH_FR_DUMP_TEMP_FILE" not in os.environ and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in os.environ:
        os.environ["TORCH_FR_DUMP_TEMP_FILE" if new_names else "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = prefix
    if version < (2, 6) and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:
        os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "2000"


def _instrument(watch, doctor_pid, role):
    import faulthandler
    import json
    import threading
    rank, local = _rank_vars()
    if role == "rank":
        _flight_recorder_settings()
    label = rank or local or "x"
    pid = os.getpid()
    stack_path = os.path.join(watch, "stacks", f"rank{label}-{pid}.txt")
    stack_file = open(stack_path, "a", encoding="utf-8")
    signum = int(os.environ.get(SIGNAL_VAR, "0"))
    if signum:
        faulthandler.register(signum, file=stack_file, all_threads=True, chain=False)
    _instrument.keep = stack_file  # faulthandler holds the fd, not the file object
    fifo = os.path.join(watch, "ctl", f"{pid}.fifo")
    fifo_fd = None
    try:
        os.mkfifo(fifo, 0o600)
        fifo_fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # RDWR: never a POLLHUP without writers
    except OSError:
        fifo = None
    pidfd = _doctor_gone_waiter(doctor_pid)
    threading.Thread(target=_serve, args=(doctor_pid, pidfd, fifo_fd, os.path.join(watch, "fr"), label),
                     name="mgft-doctor-watch", daemon=True).start()
    record = {"pid": pid, "role": role, "rank": rank, "local_rank": local,
              "world_size": os.environ.get("WORLD_SIZE", ""), "signal": signum,
              "stack_file": stack_path, "fifo": fifo}
    tmp = os.path.join(watch, "procs", f".{pid}.json")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(watch, "procs", f"{pid}.json"))
    if local:
        os.environ[SEEN_VAR] = f"{rank}/{local}"


def _setup():
    watch = os.environ.get(WATCH_VAR)
    if not watch or not os.path.isdir(watch):
        return
    try:
        doctor_pid = int(os.environ.get(DOCTOR_PID_VAR, "0"))
    except ValueError:
        return
    if os.getppid() == doctor_pid:
        _die_with_parent()
    role = _role(doctor_pid)
    if role:
        _instrument(watch, doctor_pid, role)


def _chain():
    """Run the next sitecustomize on sys.path (the user's or the distribution's), as Python would have."""
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _setup()
except Exception as exc:  # never break the user's program for the sake of the watch
    sys.stderr.write(f"mgft-doctor: rank instrumentation skipped: {type(exc).__name__}: {exc}\n")
_chain()
