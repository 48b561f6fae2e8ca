"""What nvidia-smi says about the GPUs and the links between them, with a time limit (a wedged
driver makes nvidia-smi hang) and without failing when it is absent."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field

NVSMI_TIMEOUT_S = 20


def _nvidia_smi(*args: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=NVSMI_TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return out.stdout if out.returncode == 0 else None


@dataclass
class SmiGpu:
    index: int
    name: str
    memory_mib: int | None
    driver: str | None
    uuid: str | None = None


@dataclass
class Topology:
    gpus: list[SmiGpu] = field(default_factory=list)
    links: dict[tuple[int, int], str] = field(default_factory=dict)  # (i, j) -> 'NV18', 'PIX', 'SYS', ...
    available: bool = False
    error: str | None = None

    def link(self, i: int, j: int) -> str | None:
        return self.links.get((i, j))

    @staticmethod
    def kind(link: str | None) -> str:
        """nvlink, pcie-switch (PIX/PXB), host-bridge (PHB), cpu-interconnect (NODE/SYS), or unknown."""
        if not link:
            return "unknown"
        if link.startswith("NV"):
            return "nvlink"
        return {"PIX": "pcie-switch", "PXB": "pcie-switch", "PHB": "host-bridge",
                "NODE": "cpu-interconnect", "SYS": "cpu-interconnect"}.get(link, "unknown")


def read_topology() -> Topology:
    out = _nvidia_smi("--query-gpu=index,name,memory.total,driver_version,uuid", "--format=csv,noheader,nounits")
    if out is None:
        return Topology(available=False, error="nvidia-smi not found or failed")
    topo = Topology(available=True)
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and parts[0].isdigit():
            mem = int(parts[2]) if parts[2].isdigit() else None
            topo.gpus.append(SmiGpu(int(parts[0]), parts[1], mem, parts[3], parts[4] if len(parts) > 4 else None))
    matrix = _nvidia_smi("topo", "-m")
    if matrix:
        topo.links = parse_topo_matrix(matrix)
    return topo


def parse_topo_matrix(text: str) -> dict[tuple[int, int], str]:
    """Parse `nvidia-smi topo -m`: the header names the columns, each GPUi row gives its links."""
    from ..text import strip_ansi

    lines = [strip_ansi(ln).rstrip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    cols = [h for h in header if h.startswith("GPU")]
    links = {}
    for ln in lines[1:]:
        cells = ln.split()
        if not cells or not cells[0].startswith("GPU") or not cells[0][3:].isdigit():
            continue
        i = int(cells[0][3:])
        for k, col in enumerate(cols):
            if k + 1 >= len(cells):
                break
            j = int(col[3:]) if col[3:].isdigit() else None
            if j is not None and cells[k + 1] != "X":
                links[(i, j)] = cells[k + 1]
    return links
