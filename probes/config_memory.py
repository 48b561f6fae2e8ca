"""config.memory: memory per GPU and per host for this run under each ZeRO stage and offload,
from the model's config.json (LoRA-aware, QLoRA's 4/8-bit base weights, activations and logits
included), against the GPUs and host RAM here. Says whether the configured stage fits and the
cheapest one that does."""

from __future__ import annotations


from mgft_doctor.runconfig import lf_rules, memory as me
from mgft_doctor.runconfig.reading import as_number
from mgft_doctor.check.context import Context
from mgft_doctor.check.facts import host_memory_bytes
from mgft_doctor.check.probe import Finding, Probe, Status, verdict
from mgft_doctor.text import GiB

from . import _codes

ID, TITLE = "config.memory", "Memory per GPU and host for this run"
DEFAULT_GPU_BYTES = 80 * GiB  # when no GPU is visible here, assume the common 80 GB card


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def offload_label(rc) -> str:
    off_opt = rc.offload_device("offload_optimizer")
    off_par = rc.offload_device("offload_param")
    if off_opt and off_par:
        return "optimizer+params"
    return "optimizer" if off_opt else "none"


def _model_line(where: str, shape, lora, quant) -> str:
    """The -v line that says what is counted: parameters, LoRA or full, how the base weights are held."""
    return (f"model {where}: {_count(shape.total_params)} parameters"
            + (f", MoE {shape.experts} experts" if shape.experts else "")
            + (f"; LoRA rank {lora}" if lora else "; full fine-tuning")
            + (f"; base weights {quant.describe()} on {_count(shape.quantizable_params)} linear weights "
               f"(embeddings, head, norms{', routed experts' if shape.experts else ''} stay 16-bit)" if quant else ""))


def applies(ctx: Context) -> str | None:
    """A model (--model, or the YAML's; the run config holds either) whose config.json is read
    and whose shape the memory arithmetic understands."""
    rc = ctx.run_config
    if rc is None or not rc.model:
        return "no model given (--model, or model_name_or_path in the YAML)"
    cfg, where = rc.model_config
    if cfg is None:
        return where
    try:
        me.shape_from_config(cfg)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        return f"cannot read the architecture from {where} ({exc})"
    return None


def run(ctx: Context):
    rc = ctx.run_config
    cfg, where = rc.model_config
    shape = me.shape_from_config(cfg)
    y = rc.yaml
    gpus_here = ctx.facts.gpu_count
    per_node = ctx.nproc
    world = per_node * ctx.options.nnodes
    # a quoted or float count is config.llamafactory's finding (MGD918); the estimate takes the number meant
    lora = int(as_number(y.get("lora_rank", 8)) or 8) if y.get("finetuning_type", "lora" if y else "full") == "lora" else None
    micro = int(as_number(y.get("per_device_train_batch_size", 1)) or 1)
    seq = int(as_number(y.get("cutoff_len", 2048)) or 2048)
    flash = str(y.get("flash_attn", "auto")).lower() in ("auto", "fa2", "fa3", "sdpa")
    ckpt = not y.get("disable_gradient_checkpointing", False)
    gpu_mem = min((d.get("total_memory", 0) for d in ctx.facts.devices), default=0) or DEFAULT_GPU_BYTES
    host = host_memory_bytes()
    quant = me.quantization_of(lf_rules.llamafactory_args(rc), cfg) if lora else None
    plans = me.plans(shape, world, per_node, micro, seq, lora, ckpt, flash, quant)
    stage = rc.zero_stage if rc and rc.ds is not None else None
    chosen_off = offload_label(rc) if rc and rc.ds is not None else "none"
    details = [_model_line(where, shape, lora, quant),
               f"{world} GPU(s) of {gpu_mem / GiB:.0f} GiB{' (assumed: none visible here)' if not gpus_here else ''}, "
               f"host {host / GiB:.0f} GiB" if host else "host memory unknown",
               f"micro batch {micro}, sequence {seq}, gradient checkpointing {'on' if ckpt else 'off'}, "
               f"{'flash/SDPA' if flash else 'eager'} attention"]
    fits = []
    for p in plans:
        ok_gpu = p.gpu_bytes <= gpu_mem * 0.95
        ok_host = host is None or p.host_bytes <= host * 0.9
        mark = "fits" if ok_gpu and ok_host else ("GPU too small" if not ok_gpu else "host RAM too small")
        details.append(f"ZeRO-{p.stage} offload {p.offload:17}: {p.gpu_bytes / GiB:7.1f} GiB/GPU  "
                       f"{p.host_bytes / GiB:7.1f} GiB host  {mark}")
        if ok_gpu and ok_host:
            fits.append(p)
    metrics = {"params": shape.total_params, "world_size": world,
               "base_weights_GiB": round(me.frozen_weight_bytes(shape, quant) / GiB, 3),
               "plans": [{"stage": p.stage, "offload": p.offload, "gpu_GiB": round(p.gpu_bytes / GiB, 2),
                          "host_GiB": round(p.host_bytes / GiB, 2)} for p in plans]}
    best = fits[0] if fits else None
    findings = []
    if stage is not None:
        mine = next((p for p in plans if p.stage == max(stage, 0) and p.offload == chosen_off), None)
        if mine is None:
            mine = min(plans, key=lambda p: abs(p.stage - stage))
        metrics.update({"configured_gpu_GiB": round(mine.gpu_bytes / GiB, 2), "configured_host_GiB": round(mine.host_bytes / GiB, 2)})
        if mine.gpu_bytes > gpu_mem * 0.95:
            fix = (f"Use ZeRO-{best.stage}" + (f" with {best.offload} offload" if best.offload != "none" else "") +
                   f" ({best.gpu_bytes / GiB:.0f} GiB/GPU), e.g. examples/deepspeed/ds_z3{'_offload' if best.offload != 'none' else ''}_config.json"
                   if best else "No ZeRO stage fits: use LoRA/QLoRA, more GPUs, or a shorter cutoff_len.")
            findings.append(Finding(_codes.GPU_OOM_MODEL_STATES,
                                    f"ZeRO-{stage} (offload {chosen_off}) needs about {mine.gpu_bytes / GiB:.0f} GiB per GPU; "
                                    f"the GPUs have {gpu_mem / GiB:.0f} GiB", fix,
                                    Status.FAIL if gpus_here else Status.WARN))
        elif host is not None and mine.host_bytes > host * 0.9:
            findings.append(Finding(_codes.HOST_OOM_OFFLOAD,
                                    f"offload needs about {mine.host_bytes / GiB:.0f} GiB of host RAM; this host has {host / GiB:.0f} GiB",
                                    "Offload less (optimizer only), use more nodes, or add RAM; the OOM killer ends such runs with exit code -9.",
                                    Status.WARN))
    summary = (f"{_count(shape.total_params)} params on {world} GPU(s): "
               + (f"configured ZeRO-{stage} needs ~{metrics['configured_gpu_GiB']:.0f} GiB/GPU; " if stage is not None else "")
               + (f"smallest fitting: ZeRO-{best.stage}{' + ' + best.offload + ' offload' if best.offload != 'none' else ''}"
                  if best else "no ZeRO stage fits"))
    return verdict(summary, findings, metrics, details)


PROBE = Probe(ID, TITLE, run, applies=applies)
