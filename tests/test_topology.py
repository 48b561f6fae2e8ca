from mgft_doctor.check.topology import Topology, parse_topo_matrix

# `nvidia-smi topo -m` as printed on the two-H200 machine (the header is underlined with ANSI codes)
H200_X2 = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
           "GPU0\t X \tNV18\t0-31\t0\t\tN/A\nGPU1\tNV18\t X \t0-31\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")
PCIE_X4 = ("        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity\n"
           "GPU0     X      PIX     SYS     SYS     0-31            0\n"
           "GPU1    PIX      X      SYS     SYS     0-31            0\n"
           "GPU2    SYS     SYS      X      PIX     32-63           1\n"
           "GPU3    SYS     SYS     PIX      X      32-63           1\n")


def test_nvlink_pair_with_ansi_header():
    links = parse_topo_matrix(H200_X2)
    assert links == {(0, 1): "NV18", (1, 0): "NV18"}
    assert Topology.kind(links[(0, 1)]) == "nvlink"


def test_pcie_box_across_sockets():
    links = parse_topo_matrix(PCIE_X4)
    assert links[(0, 1)] == "PIX" and links[(0, 2)] == "SYS" and links[(3, 2)] == "PIX"
    assert Topology.kind("SYS") == "cpu-interconnect" and Topology.kind("PIX") == "pcie-switch"
    assert len(links) == 12
