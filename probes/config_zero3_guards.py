"""config.zero3_guards: the checks LLaMA-Factory 0.9.5 itself makes before a multi-GPU DeepSpeed
run starts (hparams/parser.py: get_train_args; model_utils/quantization.py: configure_quantization),
applied to the user's YAML and DeepSpeed config, so that a refusal shows up here, with its fix,
and not after the launch. Only guards about ZeRO-3 and multi-GPU DeepSpeed; a pre-quantized
checkpoint (quantization_config in the model's config.json) is zero3.model's finding (the rule is
runconfig/quantization.py)."""

from __future__ import annotations

from mgft_doctor.check.context import Context
from mgft_doctor.check.probe import Finding, Probe, verdict
from mgft_doctor.text import truthy

from . import _codes

ID, TITLE = "config.zero3_guards", "LLaMA-Factory's ZeRO-3 and DeepSpeed guards for this run"
QUANT_FIX = ("Use 4-bit bitsandbytes quantization with ZeRO-3 (quantization_bit: 4, quantization_method: bnb, "
             "finetuning_type: lora; needs bitsandbytes>=0.43.0), or keep this quantization and use ZeRO-2 "
             "(examples/deepspeed/ds_z2_config.json) or no DeepSpeed.")


def guards(yaml: dict, zero3: bool, deepspeed: bool, distributed: bool) -> list[Finding]:
    """The refusals LLaMA-Factory 0.9.5 would raise for this YAML, in the order it checks them."""
    f: list[Finding] = []
    z3 = "LLaMA-Factory refuses it under DeepSpeed ZeRO-3"
    if zero3 and truthy(yaml.get("predict_with_generate")):
        f.append(Finding(_codes.LF_ZERO3_GUARD, f"predict_with_generate: true — {z3} (\"`predict_with_generate` is "
                         "incompatible with DeepSpeed ZeRO-3.\")",
                         "Drop predict_with_generate (evaluate on the loss with val_size/eval_dataset) and generate "
                         "predictions separately (scripts/vllm_infer.py), or predict with ZeRO-2 / no DeepSpeed."))
    if zero3 and truthy(yaml.get("pissa_init")):
        f.append(Finding(_codes.LF_ZERO3_GUARD, f"pissa_init: true — {z3} (\"Please use scripts/pissa_init.py to "
                         "initialize PiSSA in DeepSpeed ZeRO-3.\")",
                         "Initialise PiSSA once offline: python scripts/pissa_init.py --model_name_or_path <model> "
                         "--output_dir <dir>; then train from <dir> with adapter_name_or_path: <dir>/pissa_init and "
                         "pissa_init: false."))
    if zero3 and truthy(yaml.get("pure_bf16")):
        f.append(Finding(_codes.LF_ZERO3_GUARD, f"pure_bf16: true — {z3} (\"`pure_bf16` is incompatible with "
                         "DeepSpeed ZeRO-3.\")",
                         "Use bf16: true instead (ZeRO-3 keeps bf16 compute with fp32 master weights), or keep "
                         "pure_bf16 with ZeRO-2/DDP."))
    if distributed:
        if truthy(yaml.get("use_galore")) and truthy(yaml.get("galore_layerwise")):
            f.append(Finding(_codes.LF_OPTIMIZER_GUARD, "layer-wise GaLore on several GPUs: LLaMA-Factory refuses it "
                             "(\"Distributed training does not support layer-wise GaLore.\")",
                             "Set galore_layerwise: false, or train layer-wise GaLore on one GPU."))
        if truthy(yaml.get("use_apollo")) and truthy(yaml.get("apollo_layerwise")):
            f.append(Finding(_codes.LF_OPTIMIZER_GUARD, "layer-wise APOLLO on several GPUs: LLaMA-Factory refuses it "
                             "(\"Distributed training does not support layer-wise APOLLO.\")",
                             "Set apollo_layerwise: false, or train layer-wise APOLLO on one GPU."))
        if truthy(yaml.get("use_badam")):
            mode = str(yaml.get("badam_mode", "layer")).lower()
            if mode == "ratio":
                f.append(Finding(_codes.LF_OPTIMIZER_GUARD, "ratio-mode BAdam on several GPUs: LLaMA-Factory refuses "
                                 "it (\"Radio-based BAdam does not yet support distributed training, use layer-wise BAdam.\")",
                                 "Use badam_mode: layer with deepspeed: examples/deepspeed/ds_z3_config.json, or "
                                 "ratio-mode BAdam on one GPU."))
            elif not zero3:
                f.append(Finding(_codes.LF_OPTIMIZER_GUARD, "layer-wise BAdam on several GPUs without ZeRO-3: "
                                 "LLaMA-Factory refuses it (\"Layer-wise BAdam only supports DeepSpeed ZeRO-3 training.\")",
                                 "Add deepspeed: examples/deepspeed/ds_z3_config.json (LLaMA-Factory's BAdam recipe)."))
    if deepspeed and (truthy(yaml.get("use_galore")) or truthy(yaml.get("use_apollo"))):
        which = "GaLore" if truthy(yaml.get("use_galore")) else "APOLLO"
        f.append(Finding(_codes.LF_OPTIMIZER_GUARD, f"{which} with DeepSpeed: LLaMA-Factory refuses it (\"GaLore and "
                         "APOLLO are incompatible with DeepSpeed yet.\")",
                         f"Remove the deepspeed: key and train {which} with plain DDP "
                         "(FORCE_TORCHRUN=1 llamafactory-cli train x.yaml), or drop it and use ZeRO-3."))
    if zero3 and truthy(yaml.get("use_unsloth")):
        f.append(Finding(_codes.ZERO3_UNSLOTH, f"use_unsloth: true — {z3} (\"Unsloth is incompatible with DeepSpeed "
                         "ZeRO-3.\")",
                         "Remove use_unsloth (enable_liger_kernel: true gives a similar speed-up on several GPUs), or "
                         "train with Unsloth on one GPU."))
    if zero3 and truthy(yaml.get("use_kt")):
        f.append(Finding(_codes.LF_ZERO3_GUARD, f"use_kt: true — {z3} (\"KTransformers is incompatible with DeepSpeed "
                         "ZeRO-3.\")", "Run KTransformers without a ZeRO-3 config."))
    bit = yaml.get("quantization_bit")
    if zero3 and bit is not None:
        method = str(yaml.get("quantization_method", "bnb")).lower()
        if method in ("bnb", "bitsandbytes") and str(bit) == "8":
            f.append(Finding(_codes.ZERO3_QUANTIZED, f"quantization_bit: {bit} with bitsandbytes under ZeRO-3: "
                             "LLaMA-Factory refuses it (\"Only 4-bit quantized model can use fsdp+qlora or auto device "
                             "map.\")", QUANT_FIX))
        elif method in ("hqq", "eetq"):
            f.append(Finding(_codes.ZERO3_QUANTIZED, f"quantization_method: {method} under ZeRO-3: LLaMA-Factory refuses "
                             f"it (\"{method.upper()} quantization is incompatible with DeepSpeed ZeRO-3 or FSDP.\")",
                             QUANT_FIX))
    return f


def applies(ctx: Context) -> str | None:
    rc = ctx.run_config
    if rc is None or not rc.yaml_path:
        return "no LLaMA-Factory YAML given (mgft-doctor check train.yaml)"
    if rc.ds_error:
        return f"{rc.ds_error} (config.deepspeed reports it)"
    return None


def run(ctx: Context):
    rc = ctx.run_config
    y = rc.yaml
    stage = rc.zero_stage if rc.ds is not None else None
    zero3 = stage == 3
    world = ctx.nproc * ctx.options.nnodes
    findings = guards(y, zero3, rc.ds is not None, world > 1)
    what = (f"ZeRO-{stage}" if rc.ds is not None else "no DeepSpeed") + f", {world} ranks"
    checked = "predict_with_generate, pissa_init, pure_bf16, GaLore/APOLLO/BAdam, use_unsloth, use_kt, quantization"
    summary = f"{what}: " + (f"LLaMA-Factory would refuse {len(findings)} setting(s)" if findings
                             else "none of LLaMA-Factory's ZeRO-3/DeepSpeed refusals apply")
    details = [f"checked as LLaMA-Factory 0.9.5 does: {checked}"]
    return verdict(summary, findings, {"zero_stage": stage, "world_size": world}, details)


PROBE = Probe(ID, TITLE, run, applies=applies)
