"""config.llamafactory: what LLaMA-Factory's own argument parser, data loader and model loader
would refuse in this YAML, and what they let through that fails later (runconfig/lf_rules.py:
unknown keys, quoted numbers, refused combinations, datasets and their columns, the template,
attention, LoRA targets, the packages options need, quantization backends, the output folder),
checked before any process starts. One worker in the examined Python reads what the rules look
up there (installed packages, the parser's fields, the templates) without importing
llamafactory; it imports a quantization backend only when the YAML quantizes with it."""

from __future__ import annotations

import time

from mgft_doctor.check.context import Context
from mgft_doctor.check.probe import Finding, Probe, Status, verdict
from mgft_doctor.launch import worker_script
from mgft_doctor.launch.script import run_script
from mgft_doctor.runconfig import lf_rules

ID, TITLE = "config.llamafactory", "LLaMA-Factory's own pre-flight checks for this YAML"
TIMEOUT_S = 60.0  # reading metadata and source is quick; importing bitsandbytes (and torch) is not
PACKAGES = sorted({lf_rules.split_requirement(r)[0] for _, r in lf_rules.EXTRAS}
                  | {d for ds in lf_rules.REPORTERS.values() for d in ds}
                  | set(lf_rules.ON_THE_FLY.values()) | {d for d, _ in lf_rules.PTQ_BACKENDS.values()}
                  | {"deepspeed", "flash-attn", "transformers", "llamafactory", "peft", "accelerate", "torch"})


def applies(ctx: Context) -> str | None:
    rc = ctx.run_config
    if rc is None or not rc.yaml_path:
        return "no LLaMA-Factory YAML given (mgft-doctor check train.yaml)"
    return None


def gather_env(ctx: Context, args: dict) -> tuple[lf_rules.Env, list[str], float]:
    """The examined Python's side of the rules (lf_env worker), notes for -v, the worker's seconds."""
    backend = lf_rules.quantization_backend(lf_rules.LfRun(ctx.run_config, args))
    wanted = {"packages": PACKAGES, "imports": [backend] if backend else []}
    res = run_script(ctx.options.python, worker_script("lf_env"), wanted, timeout=min(ctx.options.timeout, TIMEOUT_S))
    d = res.payload or {}
    notes = [f"lf_env worker in {ctx.options.python}: {res.wall_s:.2f} s"
             + (f" (tried to import {backend})" if backend else "")]
    if not res.ok:
        notes.append("the worker gave no answer (" + ("timed out" if res.timed_out else f"exit {res.returncode}")
                     + "): only the checks that need nothing of the examined Python ran")
    if d and not d.get("llamafactory_dir"):
        notes.append("llamafactory is not installed there: no check of keys, templates or types (versions.compat says more)")
    templates = d.get("templates")
    env = lf_rules.Env(versions=d.get("versions") or {}, fields=d.get("fields"),
                       templates=frozenset(templates) if templates else None, bnb_min=d.get("bnb_min"),
                       integrations=d.get("integrations"), imports=d.get("imports") or {},
                       devices=(d.get("torch") or {}).get("devices"))
    return env, notes, res.wall_s


def run(ctx: Context):
    rc = ctx.run_config
    args = lf_rules.llamafactory_args(rc)
    env, notes, worker_s = gather_env(ctx, args)
    cfg = rc.model_config[0] if rc.model else None
    t0 = time.perf_counter()
    problems = lf_rules.check(rc, env, model_cfg=cfg)
    rules_ms = (time.perf_counter() - t0) * 1000
    findings = [Finding(p.code, p.message, p.fix, Status.WARN if p.severity == "warn" else Status.FAIL) for p in problems]
    ddir, how = lf_rules.find_dataset_dir(lf_rules.LfRun(rc, args), env)
    details = notes + [f"read as llamafactory-cli train reads it (OmegaConf's YAML rules), from {env.cwd}",
                       f"dataset_dir: {ddir} ({how})" if ddir else f"dataset_dir {args.get('dataset_dir', 'data')!r}: {how}",
                       f"model config: {rc.model_config[1]}" if rc.model else "no model config",
                       f"{len(lf_rules.RULES)} rules in {rules_ms:.1f} ms"]
    fails = sum(f.severity is Status.FAIL for f in findings)
    summary = (f"LLaMA-Factory would stop on {fails} setting(s)" if fails else
               f"{len(findings)} warning(s)" if findings else "nothing LLaMA-Factory checks before training is refused")
    stage = f"stage {args.get('stage', 'sft')}, {args.get('finetuning_type', 'lora')}"
    return verdict(f"{stage}: {summary}", findings, {"rules_ms": round(rules_ms, 2), "worker_s": round(worker_s, 3)},
                   details)


PROBE = Probe(ID, TITLE, run, applies=applies)
