"""Facts about this machine that several probes need: torch's view of the GPUs (read by the facts
worker in the Python under examination, through the launch package, so a hung driver or import
is killed with its whole process tree), host memory, and the CPU's native bf16. The doctor
process never imports torch itself."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from ..launch import worker_script
from ..launch.script import ScriptRun, run_script

FACTS_TIMEOUT_S = 90


@dataclass
class Facts:
    """torch's view of this machine, read in a subprocess of the Python under examination."""

    raw: dict

    @property
    def torch_ok(self) -> bool:
        return "torch" in self.raw

    @property
    def gpu_count(self) -> int:
        return int(self.raw.get("device_count") or 0)

    @property
    def devices(self) -> list[dict]:
        return list(self.raw.get("devices") or [])


def gpus_likely(env: dict | None = None) -> bool:
    """Whether torch will see a GPU, judged in a millisecond before the facts answer (seconds): the
    kernel's device nodes (/dev/nvidiaN; /dev/kfd for ROCm) and a CUDA_VISIBLE_DEVICES that does not
    hide them all. Only a head start: whoever acts on it checks it against the facts."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/kfd")


def read_facts(python: str, timeout: float = FACTS_TIMEOUT_S) -> Facts:
    """Run the facts worker in `python`; what went wrong, if anything, is in raw["facts_error"]."""
    return facts_from(run_script(python, worker_script("facts"), {}, timeout=timeout), timeout)


def facts_from(res: ScriptRun, timeout: float = FACTS_TIMEOUT_S) -> Facts:
    """The facts in a run of the facts worker (or the shared worker's facts section)."""
    if res.timed_out:
        return Facts({"facts_error": f"reading torch's facts took over {timeout:g} s (a hung driver or import)"})
    if res.payload is None:  # run_script's log says "cannot run PY: ..." when it could not start
        return Facts({"facts_error": res.log.strip()[-500:] or f"exit code {res.returncode}"})
    return Facts(res.payload)


def host_memory_bytes() -> int | None:
    """The smaller of the cgroup limit and MemTotal (containers see the host's MemTotal)."""
    limits = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="utf-8") as f:
                v = f.read().strip()
            if v.isdigit() and int(v) < 1 << 60:
                limits.append(int(v))
        except OSError:
            pass
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            limits += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:")]
    except OSError:
        pass
    return min(limits) if limits else None


def cpu_has_bf16() -> bool:
    """Native bf16 on this CPU (AVX512-BF16 or AMX): DeepSpeed's CPU accelerator then trains in bf16."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False
