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
# deepspeed.install / deepspeed.ops / versions.compat (codes proposed to the catalog's authors:
# MGD4xx = ds-build, MGD9xx = versions; see the report that added them)
DS_MISSING = "MGD901"  # deepspeed not installed / not importable in the examined Python
DS_TORCH_MISMATCH = "MGD402"  # DeepSpeed (or its pre-built ops) does not fit the installed torch/CUDA
NVCC_MISMATCH = "MGD403"  # nvcc's CUDA major version differs from torch.version.cuda
CUDA_TOOLKIT_MISSING = "MGD404"  # no nvcc / CUDA_HOME missing, wrong or a PATH-like list
NINJA_MISSING = "MGD405"  # ninja not found: JIT builds impossible
OP_BUILD_FAILED = "MGD406"  # a DeepSpeed op's JIT build fails (compiler error, no compiler, Python.h, libaio)
OP_BUILD_HANG = "MGD407"  # an op build never finishes (stale torch_extensions lock, stuck compiler)
DS_ON_CPU = "MGD110"  # GPUs present but DeepSpeed picks another accelerator (DS_ACCELERATOR=cpu)
LF_VERSION_PIN = "MGD902"  # a package outside LLaMA-Factory's own required range
REQUIREMENT_CONFLICT = "MGD903"  # installed packages violate each other's declared requirements
GPU_OOM_MODEL_STATES = "MGD701"  # model + optimizer states do not fit at this ZeRO stage
HOST_OOM_OFFLOAD = "MGD707"  # CPU offload needs more host RAM than there is
