"""nccl.p2p: GPU peer-to-peer access for every pair, proven with a verified copy and its
bandwidth, next to the link type from `nvidia-smi topo -m`. Broken P2P (PCIe ACS/IOMMU,
consumer GPUs on old drivers) is the classic cause of NCCL hangs."""

from __future__ import annotations

from mgft_doctor.check.context import Context
from mgft_doctor.launch import worker_script
from mgft_doctor.launch.script import run_script
from mgft_doctor.check.probe import Finding, Probe, Status, verdict

from . import _codes

ID, TITLE = "nccl.p2p", "GPU peer-to-peer access"
CONSUMER = ("GeForce", "RTX 40", "RTX 30", "RTX 20", "TITAN")


def applies(ctx: Context) -> str | None:
    n = ctx.facts.gpu_count
    return f"needs 2 GPUs, {n} visible" if n < 2 else None


def run(ctx: Context):
    res = run_script(ctx.options.python, worker_script("p2p"), {}, timeout=ctx.options.timeout)
    if res.timed_out:
        return verdict("a GPU-to-GPU copy hung",
                       [Finding(_codes.P2P_BROKEN, f"a direct GPU-to-GPU copy did not finish in {ctx.options.timeout:.0f} s",
                                "P2P is broken on this machine: export NCCL_P2P_DISABLE=1 for training, and check "
                                "that PCIe ACS / IOMMU are disabled (BIOS: ACS off; kernel: iommu=pt).")])
    data = res.payload
    if data is None:
        return verdict("the P2P check crashed", status=Status.ERROR,
                       details=res.log.strip().splitlines()[-15:])
    topo = ctx.topology
    names = {g.index: g.name for g in topo.gpus}
    findings, details = [], []
    no_access, broken = [], []
    for p in data["pairs"]:
        link = topo.link(p["src"], p["dst"]) or "?"
        bw = f"{p['GBps']:.1f} GB/s" if "GBps" in p else p.get("error", "")
        details.append(f"GPU{p['src']}->GPU{p['dst']}: link {link}, peer access {'yes' if p['can_access_peer'] else 'no'}, "
                       f"copy {'ok' if p.get('correct') else 'WRONG' if 'correct' in p else 'failed'}, {bw}")
        if "error" in p or p.get("correct") is False:
            broken.append(p)
        elif not p["can_access_peer"]:
            no_access.append(p)
    metrics = {"pairs": len(data["pairs"]), "pairs_without_peer_access": len(no_access),
               "min_copy_GBps": round(min((p.get("GBps", 0.0) for p in data["pairs"]), default=0.0), 2)}
    if broken:
        b = broken[0]
        findings.append(Finding(_codes.P2P_BROKEN,
                                f"GPU{b['src']}->GPU{b['dst']} copy {'returned wrong data' if b.get('correct') is False else 'failed: ' + b.get('error', '')}",
                                "Disable P2P for NCCL (export NCCL_P2P_DISABLE=1) and check PCIe ACS/IOMMU settings."))
    if no_access:
        consumer = any(any(c in names.get(p["src"], "") for c in CONSUMER) for p in no_access)
        findings.append(Finding(_codes.P2P_BROKEN,
                                f"{len(no_access)} GPU pair(s) have no peer access"
                                + (" (consumer GPUs: P2P is disabled by the driver)" if consumer else "")
                                + ": NCCL routes them through host memory, slower but working",
                                "Nothing to do if the all-reduce probe passes; expect lower bandwidth. If NCCL hangs, "
                                "export NCCL_P2P_DISABLE=1.", Status.WARN))
    summary = (f"{len(data['pairs'])} GPU pairs: " + ("all with working peer access" if not findings else
               f"{len(broken)} broken, {len(no_access)} without peer access"))
    return verdict(summary, findings, metrics, details)


PROBE = Probe(ID, TITLE, run, needs=("gpu.visible",), slow=True, applies=applies, ranks=True)
