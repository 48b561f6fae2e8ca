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
DS_AUTO_OUTSIDE_TRAINER = "MGD501"  # "auto" values that only the HF Trainer/accelerate fill
DS_BATCH_ARITHMETIC = "MGD502"  # train_batch_size != micro * accumulation * world
DS_HF_MISMATCH = "MGD503"  # DeepSpeed JSON disagrees with the TrainingArguments
ZERO3_EMPTY_SAVE = "MGD801"  # stage3_gather_16bit_weights_on_model_save false
BF16_UNSUPPORTED = "MGD803"  # bf16 asked on a GPU without bf16
DS_CONFIG_INVALID = "MGD504"  # a value DeepSpeed rejects (stage, both fp16 and bf16, nvme without path)
HANG_NEVER_TIMES_OUT = "MGD301"  # ddp_timeout so large a hang never fails
