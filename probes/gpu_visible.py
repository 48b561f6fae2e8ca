"""gpu.visible: the GPUs torch sees vs. CUDA_VISIBLE_DEVICES vs. nvidia-smi, with names,
memory, compute capability and bf16 support; a plain answer when there is no GPU."""

from __future__ import annotations


from mgft_doctor.check.context import Context
from mgft_doctor.check.probe import Finding, Probe, Status, verdict
from mgft_doctor.text import GiB, split_csv

from . import _codes

ID, TITLE = "gpu.visible", "GPUs visible to torch"


def visible_devices(value: str | None) -> list[str] | None:
    """The entries of CUDA_VISIBLE_DEVICES, None when unset ('' hides every GPU)."""
    if value is None:
        return None
    return [v for v in split_csv([value]) if v != "-1"]


def run(ctx: Context):
    facts = ctx.facts.raw
    topo = ctx.topology
    findings: list[Finding] = []
    details = []
    if "facts_error" in facts or "torch_error" in facts:
        why = facts.get("facts_error") or facts.get("torch_error")
        return verdict(f"torch cannot be imported in {ctx.options.python}: {why}",
                       [Finding(_codes.TORCH_MISSING, f"torch is not importable: {why}",
                                "Install PyTorch in this environment (a CUDA build for GPUs), or point the doctor at "
                                "the training environment with --python /path/to/env/bin/python.")])
    count = int(facts.get("device_count") or 0)
    smi_count = len(topo.gpus)
    cvd = visible_devices(facts.get("cuda_visible_devices"))
    nproc = ctx.options.nproc
    details.append(f"torch {facts.get('torch')} (CUDA {facts.get('torch_cuda') or 'none: CPU build'}) sees {count} GPU(s)")
    details.append(f"nvidia-smi: {smi_count} GPU(s)" + (f", driver {topo.gpus[0].driver}" if topo.gpus else f" ({topo.error})"))
    details.append(f"CUDA_VISIBLE_DEVICES={facts.get('cuda_visible_devices')!r}")
    metrics = {"torch_gpus": count, "nvidia_smi_gpus": smi_count,
               "cuda_visible_devices": None if cvd is None else len(cvd)}
    for d in facts.get("devices", []):
        if "name" in d:
            details.append(f"GPU{d['index']}: {d['name']}, {d['total_memory'] / GiB:.1f} GiB, "
                           f"compute capability {d['capability']}, bf16 {'yes' if d['bf16'] else 'no'}")
    if smi_count and count == 0:
        if not facts.get("torch_cuda"):
            findings.append(Finding(_codes.CPU_ONLY_TORCH,
                                    f"nvidia-smi lists {smi_count} GPU(s) but torch {facts.get('torch')} is a CPU-only build",
                                    "Install a CUDA build of PyTorch that matches the driver "
                                    "(pip install torch --index-url https://download.pytorch.org/whl/cu121 or the CUDA version your driver supports)."))
        elif cvd is not None and not cvd:
            findings.append(Finding(_codes.NPROC_GT_GPUS, "CUDA_VISIBLE_DEVICES hides every GPU",
                                    "Unset CUDA_VISIBLE_DEVICES or list the GPUs to use, e.g. CUDA_VISIBLE_DEVICES=0,1."))
        else:
            why = facts.get("cuda_error") or "torch.cuda.is_available() is False"
            findings.append(Finding(_codes.CPU_ONLY_TORCH,
                                    f"nvidia-smi lists {smi_count} GPU(s) but torch (CUDA {facts.get('torch_cuda')}) sees none: {why}",
                                    "The driver is older than torch's CUDA build or the device nodes are not visible "
                                    "(containers: --gpus all). Check `nvidia-smi` for the driver's CUDA version and install a torch built for it."))
    if cvd is not None and nproc and len(cvd) < nproc:
        findings.append(Finding(_codes.NPROC_GT_GPUS,
                                f"--nproc {nproc} but CUDA_VISIBLE_DEVICES names {len(cvd)} device(s) ({','.join(cvd) or 'none'}): "
                                f"ranks {len(cvd)}..{nproc - 1} would get no GPU ('invalid device ordinal')",
                                f"Expose {nproc} GPUs (CUDA_VISIBLE_DEVICES={','.join(str(i) for i in range(nproc))}) "
                                f"or start {len(cvd)} process(es) per node (--nproc_per_node / num_processes)."))
    elif count and nproc and nproc > count:
        findings.append(Finding(_codes.NPROC_GT_GPUS,
                                f"--nproc {nproc} but torch sees only {count} GPU(s)",
                                f"Start at most {count} process(es) per node, or make more GPUs visible."))
    if count:
        names = sorted({d.get("name", "?") for d in facts.get("devices", [])})
        mem = min((d.get("total_memory", 0) for d in facts.get("devices", [])), default=0)
        bf16 = all(d.get("bf16") for d in facts.get("devices", []))
        metrics.update({"min_gpu_memory_bytes": mem, "bf16": bf16})
        summary = f"{count} × {' / '.join(names)} ({mem / GiB:.0f} GiB each, bf16 {'yes' if bf16 else 'no'})"
        if len(names) > 1:  # MGD202 is the P2P page: mixed models have no catalog entry of their own yet
            findings.append(Finding(_codes.P2P_BROKEN, f"mixed GPU models: {', '.join(names)}",
                                    "Data-parallel ranks run at the speed of the slowest GPU; use identical GPUs "
                                    "(CUDA_VISIBLE_DEVICES) for one run.", Status.WARN))
        return verdict(summary, findings, metrics, details)
    if findings:
        return verdict("GPUs present but not usable by torch", findings, metrics, details)
    return verdict("no GPU visible: the multi-rank probes run on the CPU with gloo "
                   "(this proves the launch path, not NCCL)", findings, metrics, details, status=Status.WARN)


PROBE = Probe(ID, TITLE, run)
