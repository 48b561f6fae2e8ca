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
