"""The probes, one module each (module name = probe id with `_` for `.`), in the order the doctor
runs them. A probe module exposes PROBE (mgft_doctor.check.probe.Probe); mgft_doctor.check.registry
loads them by name. Rank-side workers live in probes/workers/ as plain scripts."""

MODULES = (
    "gpu_visible",
    "nccl_shm",
    "nccl_p2p",
    "nccl_allreduce",
    "deepspeed_install",
    "deepspeed_ops",
    "versions_compat",
    "config_deepspeed",
    "config_llamafactory",
    "config_memory",
    "config_zero3_guards",
    "zero3_model",
    "rehearsal_run",
)
