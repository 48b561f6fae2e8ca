"""LLaMA-Factory 0.9.5's rule on pre-quantized checkpoints (model_utils/quantization.py:
configure_quantization): a PTQ checkpoint (quantization_config in the model's config.json) is
refused under ZeRO-3 unless LLaMA-Factory de-quantizes it on load (fp8, mxfp4). Cheap: read from
config.json alone, so any probe may ask it without a run; zero3.model reports it."""

from __future__ import annotations

from . import codes
from .ds_rules import Problem

# quantization methods LLaMA-Factory 0.9.5 de-quantizes on load instead of refusing under ZeRO-3
DEQUANTIZED = ("fp8", "mxfp4")


def _quantization_config(cfg: dict) -> dict | None:
    q = cfg.get("quantization_config")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    q = q if isinstance(q, dict) else text.get("quantization_config")
    return q if isinstance(q, dict) else None


def prequantized_refusal(cfg: dict, stage: int | None) -> tuple[list[Problem], list[str]]:
    """(the refusal, if LLaMA-Factory refuses this checkpoint at this ZeRO stage; notes for -v)."""
    q = _quantization_config(cfg)
    if q is None:
        return [], []
    method = str(q.get("quant_method") or ("bitsandbytes" if q.get("load_in_4bit") or q.get("load_in_8bit") else "?")).lower()
    bits = q.get("bits") or ("4" if q.get("load_in_4bit") else "8" if q.get("load_in_8bit") else "?")
    if stage != 3:
        return [], [f"the checkpoint is {method}-quantized ({bits}-bit); fine without ZeRO-3 (stage {stage})"]
    if method in DEQUANTIZED:
        how = "FineGrainedFP8Config" if method == "fp8" else "Mxfp4Config"
        note = (f"the checkpoint is {method}-quantized: LLaMA-Factory de-quantizes it on load under ZeRO-3 "
                f"({how}(dequantize=True)); the run holds 16-bit weights")
        return [], [note]
    return [Problem(codes.ZERO3_QUANTIZED,
                    f"the model is a pre-quantized {method.upper()} checkpoint ({bits}-bit, quantization_config in "
                    "config.json): LLaMA-Factory refuses it under ZeRO-3 before loading (\"DeepSpeed ZeRO-3 or FSDP is "
                    "incompatible with PTQ-quantized models.\"), and ZeRO-3 cannot partition packed quantized weights",
                    "Train the original 16-bit model and let LLaMA-Factory quantize it on the fly (quantization_bit: 4, "
                    "finetuning_type: lora), or keep this checkpoint and use ZeRO-2 "
                    "(examples/deepspeed/ds_z2_config.json) or no DeepSpeed.")], []
