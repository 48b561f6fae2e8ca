"""The catalog codes that probe findings carry, in one place (a test checks each exists in
known_errors/, so a probe can never point at a missing page)."""

TORCH_MISSING = "MGD901"  # torch (or another needed package) cannot be imported
CPU_ONLY_TORCH = "MGD109"  # GPUs present but torch is a CPU build / cannot see them
NPROC_GT_GPUS = "MGD102"  # more ranks than visible GPUs
SHM_TOO_SMALL = "MGD201"  # /dev/shm too small for NCCL / DataLoader
P2P_BROKEN = "MGD202"  # GPU peer-to-peer broken or hanging
COLLECTIVE_HANG = "MGD301"  # a collective that never completes
RANK_DIED = "MGD110"  # a rank died (signal / exit) during the run
PORT_IN_USE = "MGD101"  # master port already taken
SLOW_INTERCONNECT = "MGD203"  # bandwidth far below what the link should give
WRONG_RESULT = "MGD203"  # all-reduce returned a wrong sum
