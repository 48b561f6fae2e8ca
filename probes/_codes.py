"""The catalog codes that probe findings carry, in one place: one constant per code, named after
its catalog entry (known_errors/MGDxxx.yaml), so the name at a call site says which page the
user lands on. Tests check that each exists in known_errors/ and that no code has two names."""

# the codes of the rules over the user's run, defined beside those rules (runconfig may not
# import the probes) and listed here with the others
from mgft_doctor.runconfig.codes import (  # noqa: F401
    BF16_UNSUPPORTED, DS_AUTO_OUTSIDE_TRAINER, DS_BATCH_ARITHMETIC, DS_CONFIG_INVALID, DS_HF_MISMATCH, DS_MISSING,
    DS_MIXED_PRECISION, DS_NO_ZERO_SECTION, LF_ARG_REFUSED, LF_DATASET, LF_DATASET_FORMAT, LF_EXTRA_MISSING,
    LF_LORA_TARGET, LF_OUTPUT_DIR, LF_QUANT_BACKEND, LF_STRING_NUMBER, LF_TEMPLATE, LF_UNKNOWN_KEY,
    NCCL_WATCHDOG_TIMEOUT, ZERO3_EMPTY_SAVE, ZERO3_QUANTIZED,
)

# launch and the GPUs
PORT_IN_USE = "MGD101"  # master port already taken
NPROC_GT_GPUS = "MGD102"  # more ranks than visible GPUs
CPU_ONLY_TORCH = "MGD109"  # GPUs present but torch is a CPU build / cannot see them
DS_ON_CPU = "MGD110"  # GPUs present but DeepSpeed picks another accelerator (DS_ACCELERATOR=cpu)
RANK_DIED = "MGD113"  # a rank exited with an error code and no error of its own
# NCCL, collectives and hangs
SHM_TOO_SMALL = "MGD201"  # /dev/shm too small for NCCL / DataLoader
P2P_BROKEN = "MGD202"  # P2P broken or hanging; also a wrong all-reduce sum and a busbw far below the link
COLLECTIVE_HANG = "MGD304"  # a collective that never completes (the probe's time limit, like a Ctrl-C)
OP_BUILD_HANG = "MGD305"  # an op build never finishes / a stale torch_extensions lock
# DeepSpeed's op builds
CUDA_TOOLKIT_MISSING = "MGD401"  # no nvcc / CUDA_HOME unset, missing or a PATH-like list
NVCC_MISMATCH = "MGD402"  # nvcc's CUDA major version differs from torch.version.cuda
PYTHON_H_MISSING = "MGD406"  # Python.h missing: every op build fails
CXX_MISSING = "MGD407"  # no C++ compiler for JIT builds
NINJA_MISSING = "MGD408"  # ninja missing or not on PATH
OP_BUILD_FAILED = "MGD411"  # a DeepSpeed op's JIT build fails (fallback when explain finds nothing)
AIO_MISSING = "MGD412"  # async_io cannot be built: libaio missing
DS_IMPORT_FAILED = "MGD413"  # deepspeed installed but does not import with this torch (fallback when explain finds nothing)
DS_TORCH_MISMATCH = "MGD415"  # pre-built DeepSpeed ops compiled for another torch/CUDA ('version mismatch!')
ARCH_LIST_UNPARSEABLE = "MGD416"  # TORCH_CUDA_ARCH_LIST entries like 9.0a that DeepSpeed's builder cannot parse
# ZeRO-3 and the model
ZERO3_UNSLOTH = "MGD604"  # use_unsloth with ZeRO-3
ZERO3_MODEL_CODE = "MGD605"  # model code touches a ZeRO-3-partitioned (empty) weight outside a gather
ZERO3_MOE_LEAF = "MGD607"  # MoE block not a ZeRO-3 leaf module: ranks desync (hang on NCCL)
# memory
GPU_OOM_MODEL_STATES = "MGD701"  # model + optimizer states do not fit at this ZeRO stage
HOST_OOM_OFFLOAD = "MGD707"  # CPU offload needs more host RAM than there is
# versions and LLaMA-Factory's own checks
VERSION_OUTSIDE_PIN = "MGD901"  # outside LLaMA-Factory's required range, or outside another package's Requires-Dist
LF_OPTIMIZER_GUARD = "MGD904"  # GaLore/APOLLO with DeepSpeed, layer-wise GaLore/APOLLO or ratio BAdam distributed
LF_ZERO3_GUARD = "MGD905"  # predict_with_generate / pure_bf16 / pissa_init / use_kt under ZeRO-3
TORCH_MISSING = "MGD908"  # torch missing or broken where the run needs it (also: package metadata unreadable)
LF_MISSING = "MGD151"  # a LLaMA-Factory YAML, and no llamafactory in the examined Python
