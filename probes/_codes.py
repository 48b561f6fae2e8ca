"""The catalog codes that probe findings carry, in one place (a test checks each exists in
known_errors/, so a probe can never point at a missing page)."""

TORCH_MISSING = "MGD908"  # torch (or another needed package) cannot be imported
CPU_ONLY_TORCH = "MGD109"  # GPUs present but torch is a CPU build / cannot see them
NPROC_GT_GPUS = "MGD102"  # more ranks than visible GPUs
SHM_TOO_SMALL = "MGD201"  # /dev/shm too small for NCCL / DataLoader
P2P_BROKEN = "MGD202"  # GPU peer-to-peer broken or hanging
COLLECTIVE_HANG = "MGD304"  # a collective that never completes (the probe's time limit, like a Ctrl-C)
RANK_DIED = "MGD113"  # a rank exited with an error code and no error of its own
PORT_IN_USE = "MGD101"  # master port already taken
SLOW_INTERCONNECT = "MGD202"  # bandwidth far below what the link should give
WRONG_RESULT = "MGD202"  # all-reduce returned a wrong sum
DS_AUTO_OUTSIDE_TRAINER = "MGD501"  # "auto" values that only the HF Trainer/accelerate fill
DS_BATCH_ARITHMETIC = "MGD502"  # train_batch_size != micro * accumulation * world
DS_HF_MISMATCH = "MGD503"  # DeepSpeed JSON disagrees with the TrainingArguments
ZERO3_EMPTY_SAVE = "MGD801"  # stage3_gather_16bit_weights_on_model_save false
BF16_UNSUPPORTED = "MGD805"  # bf16 asked on a GPU without bf16
DS_CONFIG_INVALID = "MGD509"  # a value DeepSpeed rejects (stage, both fp16 and bf16, nvme without path)
HANG_NEVER_TIMES_OUT = "MGD301"  # ddp_timeout so large a hang never fails
# deepspeed.install / deepspeed.ops / versions.compat
PACKAGE_MISSING = TORCH_MISSING  # llamafactory (or torch) missing where the run needs it
DS_MISSING = "MGD907"  # DeepSpeed requested but the deepspeed package is not installed
DS_IMPORT_FAILED = "MGD413"  # deepspeed installed but does not import with this torch (fallback when explain finds nothing)
DS_TORCH_MISMATCH = "MGD415"  # pre-built DeepSpeed ops compiled for another torch/CUDA ('version mismatch!')
CUDA_TOOLKIT_MISSING = "MGD401"  # no nvcc / CUDA_HOME unset, missing or a PATH-like list
NVCC_MISMATCH = "MGD402"  # nvcc's CUDA major version differs from torch.version.cuda
PYTHON_H_MISSING = "MGD406"  # Python.h missing: every op build fails
CXX_MISSING = "MGD407"  # no C++ compiler for JIT builds
NINJA_MISSING = "MGD408"  # ninja missing or not on PATH
ARCH_LIST_UNPARSEABLE = "MGD416"  # TORCH_CUDA_ARCH_LIST entries like 9.0a that DeepSpeed's builder cannot parse
OP_BUILD_FAILED = "MGD411"  # a DeepSpeed op's JIT build fails (fallback when explain finds nothing)
AIO_MISSING = "MGD412"  # async_io cannot be built: libaio missing
OP_BUILD_HANG = "MGD305"  # an op build never finishes / a stale torch_extensions lock
DS_ON_CPU = "MGD110"  # GPUs present but DeepSpeed picks another accelerator (DS_ACCELERATOR=cpu)
LF_VERSION_PIN = "MGD901"  # a package outside LLaMA-Factory's own required range (its start-up ImportError)
REQUIREMENT_CONFLICT = "MGD901"  # installed packages outside each other's declared ranges (pip check)
GPU_OOM_MODEL_STATES = "MGD701"  # model + optimizer states do not fit at this ZeRO stage
HOST_OOM_OFFLOAD = "MGD707"  # CPU offload needs more host RAM than there is
# zero3.model / config.zero3_guards
ZERO3_MODEL_CODE = "MGD605"  # model code touches a ZeRO-3-partitioned (empty) weight outside a gather
ZERO3_MOE_LEAF = "MGD607"  # MoE block not a ZeRO-3 leaf module: ranks desync (hang on NCCL)
ZERO3_QUANTIZED = "MGD603"  # pre-quantized checkpoint / quantization_bit that LLaMA-Factory refuses under ZeRO-3
ZERO3_UNSLOTH = "MGD604"  # use_unsloth with ZeRO-3
LF_ZERO3_GUARD = "MGD905"  # predict_with_generate / pure_bf16 / pissa_init / use_kt under ZeRO-3
LF_OPTIMIZER_GUARD = "MGD904"  # GaLore/APOLLO with DeepSpeed, layer-wise GaLore/APOLLO or ratio BAdam distributed
