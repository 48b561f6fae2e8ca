"""nccl.allreduce: a real all-reduce across N ranks (NCCL on GPUs, gloo on CPU): the sum is
checked, algbw/busbw are measured (busbw = algbw * 2(n-1)/n, as nccl-tests) and compared with
what the link between the GPUs should give. A hang is caught by the time limit and becomes a
finding that names the silent ranks."""

from __future__ import annotations

from mgft_doctor.check.context import Context
from mgft_doctor.check.facts import gpus_likely
from mgft_doctor.check.launch_findings import launch_failure_findings
from mgft_doctor.launch import worker_script
from mgft_doctor.launch.torchrun import launch
from mgft_doctor.check.probe import Finding, Probe, Status, verdict
from mgft_doctor.check.topology import Topology

from . import _codes

ID, TITLE = "nccl.allreduce", "All-reduce across ranks"
# Bus bandwidth below which a link of this kind is suspect (GB/s). Well under healthy figures:
# NVLink gives hundreds, PCIe 4/5 x16 gives 10-50; far below means P2P is off or broken.
EXPECTED_MIN_BUSBW = {"nvlink": 40.0, "pcie-switch": 4.0, "host-bridge": 3.0, "cpu-interconnect": 2.0}
GPU_SIZES_MB = [8, 64, 256]
CPU_SIZES_MB = [1, 8, 32]
HANG_FIX = ("Find the stuck link: run with NCCL_DEBUG=INFO; on PCIe/consumer GPUs try NCCL_P2P_DISABLE=1; "
            "on a single node without InfiniBand try NCCL_IB_DISABLE=1; pin the interface with NCCL_SOCKET_IFNAME; "
            "check that PCIe ACS/IOMMU is off (nccl-tests' all_reduce_perf reproduces it).")


def worst_link(topo: Topology, n: int) -> str | None:
    order = ["cpu-interconnect", "host-bridge", "pcie-switch", "nvlink"]
    kinds = [Topology.kind(topo.link(i, j)) for i in range(n) for j in range(n) if i != j]
    kinds = [k for k in kinds if k != "unknown"]
    return min(kinds, key=order.index) if kinds else None


def run(ctx: Context):
    """Starts at once (Probe.early) where the device nodes show no GPU (gpus_likely): two gloo ranks
    (or --nproc) need nothing of the facts, so torchrun starts beside the worker reading them; the
    facts then decide, and a launch on another backend or rank count than they call for is run
    again as they say. Where a GPU is likely it waits for the facts, as before."""
    early = None if gpus_likely() else ("gloo", ctx.options.nproc or 2)
    res = _launch(ctx, *early) if early is not None else None
    backend = ctx.backend
    nproc = ctx.nproc
    gpus = ctx.facts.gpu_count
    if early != (backend, nproc):
        res = None
    if backend == "nccl" and nproc > gpus:
        return verdict(f"{nproc} ranks but {gpus} GPU(s)",
                       [Finding(_codes.NPROC_GT_GPUS, f"cannot run {nproc} NCCL ranks on {gpus} GPU(s)",
                                f"Use --nproc {gpus} or make more GPUs visible.")])
    if res is None:
        res = _launch(ctx, backend, nproc)
    o = ctx.options
    world = nproc * o.nnodes
    if not res.ok:
        findings, details = launch_failure_findings(res, f"the {backend} all-reduce on {world} ranks",
                                                    _codes.COLLECTIVE_HANG, _codes.RANK_DIED, HANG_FIX)
        short = "hung (time limit reached)" if res.timed_out else "failed"
        return verdict(f"the {backend} all-reduce on {world} ranks {short}", findings,
                       {"wall_s": round(res.wall_s, 2)}, details, status=Status.FAIL)
    rows = res.results()
    first = rows[0]
    findings = []
    details = [f"{backend} on {world} rank(s) ({nproc} on this node), torch {first.get('torch')}"]
    if not all(r.get("correct") for r in rows):
        bad = [r["rank"] for r in rows if not r.get("correct")]
        findings.append(Finding(_codes.P2P_BROKEN, f"all-reduce returned a wrong sum on ranks {bad} "
                                f"(got {first.get('value')}, expected {first.get('expected')})",
                                "Data corruption between GPUs: disable P2P (NCCL_P2P_DISABLE=1) and check the GPUs/driver."))
    for s in first["sizes"]:
        details.append(f"{s['size_bytes'] / (1 << 20):6.0f} MiB: {s['time_s'] * 1e3:8.2f} ms  "
                       f"algbw {s['algbw_GBps']:7.2f} GB/s  busbw {s['busbw_GBps']:7.2f} GB/s")
    big = first["sizes"][-1]
    metrics = {"backend": backend, "world_size": world, "busbw_GBps": round(big["busbw_GBps"], 3),
               "algbw_GBps": round(big["algbw_GBps"], 3), "message_bytes": big["size_bytes"],
               "wall_s": round(res.wall_s, 2),
               "sizes": [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in s.items()} for s in first["sizes"]]}
    if world == 1:  # one rank moves no data between devices: nothing to measure, nothing to claim
        for key in ("busbw_GBps", "algbw_GBps"):
            metrics[key] = None
        return verdict(f"{backend}, 1 rank: all-reduce verified; one GPU has no link to measure", findings, metrics, details)
    summary = f"{backend}, {world} ranks: result correct, busbw {big['busbw_GBps']:.2f} GB/s at {big['size_bytes'] >> 20} MiB"
    if backend == "nccl":
        link = worst_link(ctx.topology, min(nproc, ctx.facts.gpu_count))
        metrics["link"] = link
        floor = EXPECTED_MIN_BUSBW.get(link or "")
        if link:
            summary += f" over {link}"
        if floor and big["busbw_GBps"] < floor:
            findings.append(Finding(_codes.P2P_BROKEN,
                                    f"busbw {big['busbw_GBps']:.1f} GB/s is far below what {link} should give (>= {floor:.0f} GB/s)",
                                    "P2P is probably off or falling back to host memory: check NCCL_P2P_DISABLE/NCCL_P2P_LEVEL, "
                                    "PCIe ACS/IOMMU settings and `nvidia-smi topo -m`.", Status.WARN))
    return verdict(summary, findings, metrics, details)


def _launch(ctx: Context, backend: str, nproc: int):
    sizes = GPU_SIZES_MB if backend == "nccl" else CPU_SIZES_MB
    args = {"backend": backend, "sizes_mb": sizes, "iters": 10 if backend == "nccl" else 3,
            "warmup": 3 if backend == "nccl" else 1, "pg_timeout": max(30.0, ctx.options.timeout),
            "fault": ctx.fault_for(ID)}
    o = ctx.options
    return launch(worker_script("allreduce"), nproc=nproc, timeout=o.timeout, python=o.python, args=args,
                  nnodes=o.nnodes, node_rank=o.node_rank, master_addr=o.master_addr, master_port=o.master_port)


# early: on a machine without GPU device nodes the gloo ranks start beside the facts; gpu.visible
# still decides (a failure there turns this into the usual needs-skip)
PROBE = Probe(ID, TITLE, run, needs=("gpu.visible",), slow=True, ranks=True, early=True)
