"""nccl.shm: the size of /dev/shm. NCCL's intra-node transport and DataLoader workers live
there; Docker's default of 64 MB makes NCCL fail ('unhandled system error') or ranks die of SIGBUS."""

from __future__ import annotations

import os

from mgft_doctor.check.context import Context
from mgft_doctor.check.probe import Finding, Probe, Status, verdict

from . import _codes

ID, TITLE = "nccl.shm", "Shared memory (/dev/shm)"
MiB = 1 << 20
FAIL_BELOW = 256 * MiB
WARN_BELOW = 1024 * MiB
SHM_PATH = "/dev/shm"


def run(ctx: Context):
    path = SHM_PATH
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return verdict(f"{path} is missing ({exc.strerror})",
                       [Finding(_codes.SHM_TOO_SMALL, f"{path} does not exist or cannot be read",
                                "Mount a tmpfs at /dev/shm (containers: --shm-size=16g or --ipc=host).")])
    size = st.f_frsize * st.f_blocks
    free = st.f_frsize * st.f_bavail
    metrics = {"size_bytes": size, "free_bytes": free}
    summary = f"{path}: {size / MiB:,.0f} MiB ({free / MiB:,.0f} MiB free)"
    fix = ("Give the container more shared memory: docker run --shm-size=16g (or --ipc=host); "
           "on Kubernetes mount an emptyDir with medium: Memory at /dev/shm.")
    if size < FAIL_BELOW:
        f = Finding(_codes.SHM_TOO_SMALL, f"{path} is only {size / MiB:.0f} MiB: NCCL's shared-memory transport and "
                    "DataLoader workers need more (NCCL 'unhandled system error', Bus error / exit code -7)", fix)
        return verdict(summary, [f], metrics)
    if free < FAIL_BELOW:
        f = Finding(_codes.SHM_TOO_SMALL, f"{path} has only {free / MiB:.0f} MiB free of {size / MiB:.0f} MiB "
                    "(stale segments of crashed runs?)", "Remove stale files in /dev/shm (nccl-*, torch_*) or enlarge it. " + fix)
        return verdict(summary, [f], metrics)
    if size < WARN_BELOW:
        f = Finding(_codes.SHM_TOO_SMALL, f"{path} is {size / MiB:.0f} MiB: enough for NCCL on a few GPUs, tight "
                    "with many DataLoader workers", fix, Status.WARN)
        return verdict(summary, [f], metrics)
    return verdict(summary, metrics=metrics)


PROBE = Probe(ID, TITLE, run)
