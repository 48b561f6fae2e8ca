"""config.deepspeed: the user's DeepSpeed JSON (and the LLaMA-Factory YAML that names it)
against what DeepSpeed and the HF Trainer accept: "auto" values, batch arithmetic, precision,
ZeRO sections, a ddp_timeout so large that a hang never fails, and what the Trainer and
accelerate refuse when the YAML and the JSON disagree (clipping, optimizer and scheduler
fields, fp16/bf16, no zero_optimization), quoted as they print it. Each problem says its
repair; `mgft-doctor fix` applies them."""

from __future__ import annotations

from mgft_doctor.runconfig import ds_rules as dsconfig_rules
from mgft_doctor.check.context import Context
from mgft_doctor.check.probe import Finding, Probe, Status, verdict

ID, TITLE = "config.deepspeed", "DeepSpeed config and run arguments"


def world_size(ctx: Context) -> int:
    return ctx.nproc * ctx.options.nnodes


def gpu_bf16(ctx: Context) -> bool | None:
    devices = [d for d in ctx.facts.devices if "bf16" in d]
    return all(d["bf16"] for d in devices) if devices else None


def applies(ctx: Context) -> str | None:
    rc = ctx.run_config
    if rc is None or (rc.ds is None and not rc.yaml_path):
        return "no run config given (mgft-doctor check train.yaml or ds_config.json)"
    return None


def run(ctx: Context):
    rc = ctx.run_config
    world = world_size(ctx)
    problems = dsconfig_rules.check(rc, world, gpu_bf16(ctx))
    findings = [Finding(p.code, p.message, p.fix, Status.WARN if p.severity == "warn" else Status.FAIL)
                for p in problems]
    what = []
    if rc.yaml_path:
        what.append(f"{rc.yaml_path} (stage {rc.get('stage', '?')}, {rc.get('finetuning_type', 'lora')})")
    if rc.ds is not None:
        what.append(f"{rc.ds_path}: ZeRO-{rc.zero_stage}" + (f", offload {'+'.join(sorted(rc.offload))}" if rc.offload else ""))
    elif rc.yaml_path and not rc.ds_error:
        what.append("no DeepSpeed config (DDP)")
    details = [f"world size assumed: {world} ({ctx.nproc} per node × {ctx.options.nnodes} node(s))"]
    summary = "; ".join(what) + (f": {len(findings)} problem(s)" if findings else ": consistent")
    return verdict(summary, findings, {"world_size": world, "zero_stage": rc.zero_stage if rc.ds else None},
                   details)


PROBE = Probe(ID, TITLE, run, applies=applies)
