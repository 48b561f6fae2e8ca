"""The catalog codes that the rules over the user's run (ds_rules.py, quantization.py, lf_rules.py) carry in their Problems,
one constant per code, named after its catalog entry. Defined here because runconfig may not
import the probes; probes/_codes.py re-exports them, so the code table stays one list."""

NCCL_WATCHDOG_TIMEOUT = "MGD301"  # ddp_timeout so large that the watchdog never ends a hang
DS_AUTO_OUTSIDE_TRAINER = "MGD501"  # "auto" values that only the HF Trainer/accelerate fill
DS_BATCH_ARITHMETIC = "MGD502"  # train_batch_size != micro * accumulation * world
DS_HF_MISMATCH = "MGD503"  # DeepSpeed JSON disagrees with the TrainingArguments
DS_CONFIG_INVALID = "MGD509"  # a value DeepSpeed rejects (stage, both fp16 and bf16, nvme without path)
ZERO3_QUANTIZED = "MGD603"  # pre-quantized checkpoint / quantization_bit that LLaMA-Factory refuses under ZeRO-3
ZERO3_EMPTY_SAVE = "MGD801"  # stage3_gather_16bit_weights_on_model_save false
BF16_UNSUPPORTED = "MGD805"  # bf16 asked on a GPU without bf16
DS_NO_ZERO_SECTION = "MGD510"  # accelerate: a DeepSpeed JSON used through the Trainer without zero_optimization
DS_MIXED_PRECISION = "MGD511"  # accelerate: the YAML's fp16/bf16 against the other one enabled in the JSON
DS_MISSING = "MGD907"  # DeepSpeed requested but the deepspeed package is not installed
# LLaMA-Factory's own pre-flight (lf_rules.py)
LF_ARG_REFUSED = "MGD920"  # an argument value or combination LLaMA-Factory's parser or loader refuses
LF_UNKNOWN_KEY = "MGD932"  # a YAML key no argument has ("Some keys are not used by the HfArgumentParser")
LF_DATASET = "MGD925"  # dataset not in dataset_info.json, its file missing, the wrong kind for the stage
LF_DATASET_FORMAT = "MGD960"  # the dataset's rows do not have the columns/roles its declared format reads
LF_TEMPLATE = "MGD927"  # template name LLaMA-Factory does not know
LF_LORA_TARGET = "MGD961"  # lora_target names no module of the architecture
LF_EXTRA_MISSING = "MGD931"  # the package an option needs (unsloth, liger-kernel, wandb, flash-attn, ...) is missing
LF_QUANT_BACKEND = "MGD916"  # quantization_bit's backend (bitsandbytes, hqq, eetq) missing, too old, or not for this device
LF_OUTPUT_DIR = "MGD933"  # output_dir holds a model / a checkpoint it resumes from; resume_from_checkpoint points nowhere
LF_STRING_NUMBER = "MGD918"  # a number (or flag) quoted in the YAML reaches the code as a string
