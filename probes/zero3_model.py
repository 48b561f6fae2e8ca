"""zero3.model: does DeepSpeed ZeRO-3 support *this* model? A tiny real two-rank run of the
user's architecture: its config.json (never the weights) shrunk to 2 layers and small widths,
built under deepspeed.zero.Init with the user's DeepSpeed config (LLaMA-Factory's ZeRO-3 config
when none is given), then forward, backward, an optimizer step, a second step with the config's
gradient accumulation, a 16-bit consolidated save and a reload compared weight by weight with
the gathered parameters. MoE models run with their routing forced apart across ranks, first
with the MoE blocks as ZeRO-3 leaf modules, then without any (under a short time limit), which
shows whether the leaf modules are needed and whether the user's run sets them.

Remote code (auto_map) runs only with --trust-remote-code."""

from __future__ import annotations

import os

from mgft_doctor.check.context import Context
from mgft_doctor.check.facts import cpu_has_bf16
from mgft_doctor.check.launch_findings import launch_failure_findings
from mgft_doctor.launch import worker_script
from mgft_doctor.launch.torchrun import launch
from mgft_doctor.check.probe import Finding, Probe, Status, skip, verdict
from mgft_doctor.probes.workers._moe import is_moe
from mgft_doctor.runconfig.quantization import prequantized_refusal

from . import _codes

ID, TITLE = "zero3.model", "ZeRO-3 trains, saves and reloads this model (tiny two-rank copy)"
NPROC = 2
MOE_LIMIT_S = 45.0  # cap on the inner time limit of the no-leaf-modules run
YAML_KEYS = ("gradient_accumulation_steps", "max_grad_norm", "learning_rate", "adam_beta1", "adam_beta2",
             "adam_epsilon", "weight_decay", "bf16", "fp16", "disable_gradient_checkpointing", "use_reentrant_gc")
SIZE_ZERO_HINTS = ("size 0", "with size 0", "(0)", "torch.size([0])", "must be 2-d", "at least three dimensions",
                   "shape '[0]'", "numel() == 0", "0 elements", "x0 ", "vec (0)", "expected 2d", "is empty")
SAVE_FIX = ('Set "stage3_gather_16bit_weights_on_model_save": true under zero_optimization (LLaMA-Factory\'s '
            "ds_z3_config.json has it), or, after training, run the zero_to_fp32.py script that DeepSpeed writes into "
            "each checkpoint folder to rebuild full weights from the ZeRO shards.")


def _tokenizer_files(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in
               ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json"))


def quantization_findings(cfg: dict, stage: int | None) -> tuple[list[Finding], list[str]]:
    """LLaMA-Factory's refusal of a pre-quantized checkpoint under ZeRO-3 (runconfig/quantization.py),
    as this probe's findings, and the notes for -v."""
    problems, notes = prequantized_refusal(cfg, stage)
    return [Finding(p.code, p.message, p.fix) for p in problems], notes


def applies(ctx: Context) -> str | None:
    """A model (--model, or the YAML's; the run config holds either) with a readable config.json,
    a usable DeepSpeed config, and torch in the examined Python."""
    rc = ctx.run_config
    if rc is None or not rc.model:
        return "no model given (--model PATH_OR_ID, or model_name_or_path in the YAML)"
    if rc.ds_error:
        return f"{rc.ds_error} (config.deepspeed reports it)"
    if "torch" not in ctx.facts.raw:
        return "torch is not importable in the examined Python (gpu.visible reports it)"
    cfg, where = rc.model_config
    if cfg is None:
        return f"cannot read the model's config.json: {where}"
    return None


def run(ctx: Context):
    o = ctx.options
    rc = ctx.run_config
    model = rc.model
    cfg, where = rc.model_config
    # a local folder, or the snapshot folder of the Hugging Face cache that holds config.json (its
    # code and tokenizer files, if any, lie beside it): both are read in place; only a config fetched
    # from the hub leaves the worker to fetch remote code, into the doctor's own cache
    from_hub = where.startswith("hub:")
    model_ref = model if from_hub else os.path.dirname(os.path.abspath(where))
    local_dir = not from_hub
    yaml = rc.yaml
    ds = rc.ds
    stage = rc.zero_stage if ds is not None else 3

    details = [f"model: {where}"]
    if rc.yaml_path and ds is None:
        details.append("the YAML trains without DeepSpeed: this run shows what ZeRO-3 would do with the model")
    findings, notes = quantization_findings(cfg, stage)
    details += notes
    auto_map = cfg.get("auto_map") or {}
    if auto_map and not o.trust_remote_code:
        details.append("the model ships its own code (auto_map); without --trust-remote-code only transformers' "
                       "built-in implementation of its model_type can run" + (
                           " (the YAML sets trust_remote_code: true, but the doctor needs the flag)"
                           if yaml.get("trust_remote_code") else ""))

    cache = o.cache_dir
    args = {"model": model_ref, "config_dict": cfg, "trust_remote_code": bool(o.trust_remote_code),
            "use_tokenizer": local_dir and _tokenizer_files(model_ref),
            "ds_config": ds, "yaml": {k: yaml[k] for k in YAML_KEYS if k in yaml},
            "moe_check": True, "moe_limit_s": min(MOE_LIMIT_S, max(10.0, o.timeout / 4)),
            "pg_timeout": max(60.0, o.timeout)}
    env = {"TORCH_EXTENSIONS_DIR": os.path.join(cache, "torch_extensions"),
           "HF_MODULES_CACHE": os.path.join(cache, "hf_modules"),
           "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
    if from_hub:
        env["HF_HUB_CACHE"] = os.path.join(cache, "hf_hub")
    verdicts = [(backend, n, _run_once(ctx, backend, n, cfg, args, env, model, list(findings), list(details)))
                for backend, n in plan_runs(ctx)]
    return combine(verdicts)


def plan_runs(ctx: Context) -> list[tuple[str, int]]:
    """One NCCL run over the GPUs (DESIGN §3: one rank per GPU) in the run's precision; with a single
    GPU also a two-rank gloo run on the CPU, so that partitioning across ranks is exercised."""
    gpus = ctx.facts.gpu_count if ctx.use_gpus else 0
    if not gpus:
        return [("gloo", NPROC)]
    n = min(ctx.nproc, gpus)
    return [("nccl", n)] + ([("gloo", NPROC)] if n < NPROC else [])


def _run_once(ctx: Context, backend: str, nproc: int, cfg: dict, args: dict, env: dict, model: str,
              findings: list[Finding], details: list[str]):
    o = ctx.options
    args = dict(args, backend=backend, moe_check=args["moe_check"] and nproc >= 2)
    args["bf16_ok"] = all(d.get("bf16") for d in ctx.facts.devices) if backend == "nccl" else cpu_has_bf16()
    if backend == "nccl" and is_moe(cfg):
        # a desynchronised collective on NCCL is a hang: let the watchdog end it soon after the inner limit
        args["pg_timeout"] = args["moe_limit_s"] + 60.0
    env = dict(env)
    if backend == "gloo":
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
        # on a GPU host the gloo run stands in for two ranks: DeepSpeed's CPU shm all-reduce op, which
        # the NCCL run never builds, is not built for it (a cold build was most of its init_distributed)
        args["skip_shm_op"] = ctx.facts.gpu_count > 0
    res = launch(worker_script("zero3_model"), nproc=nproc, timeout=o.timeout, python=o.python, args=args, env=env,
                 master_addr="127.0.0.1", master_port=None)
    return judge(res, backend, model, findings, details)


def combine(verdicts):
    """The first run decides the headline; a second (the gloo pass of a one-GPU machine) adds its
    findings and details, and its own line to the summary."""
    (backend, n, first), rest = verdicts[0], verdicts[1:]
    if not rest:
        return first
    findings, details, metrics = list(first.findings), list(first.details), dict(first.metrics)
    parts = [first.summary]
    for b, m, v in rest:
        findings += [f for f in v.findings if (f.code, f.message) not in {(g.code, g.message) for g in findings}]
        details += [f"-- {m} {b} ranks (partitioning across ranks) --", *v.details]
        metrics[f"{b}_pass"] = v.metrics
        parts.append(f"on {m} {b} ranks: {v.summary}")
    worst = max((v.status for _, _, v in verdicts), key=lambda s: _SEVERITY[s])
    return verdict("; ".join(parts), findings, metrics, details, status=worst)


_SEVERITY = {Status.PASS: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3, Status.ERROR: 4}


def _frame_text(frame: dict | None) -> str:
    if not frame:
        return ""
    name = os.path.basename(frame.get("file", ""))
    return f"{name}:{frame.get('line')} in {frame.get('function')}: {frame.get('code', '')}"


def _is_model_code(frame: dict | None) -> bool:
    if not frame:
        return False
    f = frame.get("file", "")
    return ("modeling_" in os.path.basename(f) or "transformers_modules" in f) and "zero3_model.py" not in f


def judge(res, backend: str, model: str, findings: list[Finding], details: list[str]):
    ranks = {r: o.result for r, o in res.ranks.items() if o.result is not None}
    r0 = ranks.get(0) or next(iter(ranks.values()), None)
    world = len(res.ranks) or NPROC
    metrics = {"backend": backend, "world_size": world, "wall_s": round(res.wall_s, 2)}
    if r0 is None:  # no rank said anything: a launch problem
        fs, ds = launch_failure_findings(res, f"the ZeRO-3 run of {model}", _codes.COLLECTIVE_HANG, _codes.RANK_DIED,
                                         "Check the launch log (mgft-doctor check -v); nccl.allreduce tests the ranks alone.")
        return verdict(f"the {world}-rank ZeRO-3 run did not start", findings + fs, metrics, details + ds,
                       status=Status.FAIL)
    failure = next((r.get("failure") for r in ranks.values() if r.get("failure")), None)
    details += _describe(r0)
    metrics.update(_metrics(r0))
    if failure:
        return _judge_failure(res, r0, failure, backend, model, findings, details, metrics)

    # run A finished on every rank that answered
    missing = [r for r in res.ranks if r not in ranks]
    if missing and not (r0.get("no_leaf") or {}).get("started"):
        fs, ds = launch_failure_findings(res, f"the ZeRO-3 run of {model}", _codes.COLLECTIVE_HANG, _codes.RANK_DIED,
                                         "Check the launch log (mgft-doctor check -v).")
        return verdict(f"the {world}-rank ZeRO-3 run did not finish", findings + fs, metrics, details + ds,
                       status=Status.FAIL)
    facts = r0.get("ds_facts") or {}
    stage = facts.get("stage")
    proven = []
    if r0.get("global_steps") != 2:
        findings.append(Finding(_codes.ZERO3_MODEL_CODE, f"two optimizer steps were run but DeepSpeed counted "
                                f"{r0.get('global_steps')}", "Check gradient_accumulation_steps in the DeepSpeed config."))
    changed = r0.get("params_changed") or {}
    if changed and not any(changed.values()):
        findings.append(Finding(_codes.ZERO3_MODEL_CODE, "the optimizer steps left the weights unchanged "
                                f"({', '.join(changed)})", "Check that the parameters require grad and the learning rate "
                                "is not 0.", Status.WARN))
    findings += _save_findings(r0, stage)
    moe_f, moe_d, moe_summary = _moe_verdict(res, ranks, r0, model)
    findings += moe_f
    details += moe_d
    ga = facts.get("accumulation", 1)
    build = r0.get("build") or {}
    steps = r0.get("steps") or {}
    proven.append(f"ZeRO-{stage} on {world} {backend} rank{'s' if world > 1 else ''}" + (" with zero.Init" if stage == 3 else ""))
    proven.append("forward, backward, 2 optimizer steps" + (f" (accumulation {ga})" if ga > 1 else ""))
    rel = r0.get("reload") or {}
    if (r0.get("save") or {}).get("saved") and rel.get("compared"):
        same = not rel.get("mismatched") and not rel.get("empty") and not rel.get("missing")
        proven.append(f"16-bit save + reload {'identical' if same else 'checked'} ({rel['compared']} tensors)")
    if build.get("gradient_checkpointing"):
        proven.append("gradient checkpointing on")
    took = sum(v for k, v in steps.items() if not k.startswith("no_leaf"))
    summary = f"{r0.get('model_type')}: " + ", ".join(proven) + f" in {res.wall_s:.0f} s"
    if moe_summary:
        summary += f"; {moe_summary}"
    metrics["steps_s"] = round(took, 2)
    return verdict(summary, findings, metrics, details)


def _metrics(r0: dict) -> dict:
    m = {"model_type": r0.get("model_type"), "shrunk_params": r0.get("params"),
         "zero_stage": (r0.get("ds_facts") or {}).get("stage"),
         "precision": (r0.get("ds_facts") or {}).get("precision"),
         "accumulation": (r0.get("ds_facts") or {}).get("accumulation")}
    if r0.get("losses"):
        m["losses"] = [round(x, 4) for x in r0["losses"]]
    if (r0.get("reload") or {}).get("saved_bytes"):
        m["saved_bytes"] = r0["reload"]["saved_bytes"]
    m["step_times_s"] = r0.get("steps") or {}
    return {k: v for k, v in m.items() if v is not None}


def _describe(r0: dict) -> list[str]:
    v = r0.get("versions") or {}
    lines = [f"torch {v.get('torch')}, deepspeed {v.get('deepspeed')}, transformers {v.get('transformers')}"]
    if r0.get("shrink_notes"):
        lines.append("shrunk: " + "; ".join(r0["shrink_notes"][:24]))
    if r0.get("params"):
        lines.append(f"shrunk model: {r0['params']:,} parameters" + (f", vocabulary {r0.get('vocab_size')}"))
    if r0.get("tokenizer"):
        t = r0["tokenizer"]
        lines.append(f"tokenizer {t['class']} ({t['len']} tokens) used for the inputs; vocabulary kept")
        if r0.get("tokenizer_beyond_vocab"):
            lines.append(f"the tokenizer produced id {r0.get('tokenizer_max_id')} >= vocab_size {r0.get('vocab_size')}: "
                         "training needs resize_vocab: true")
    f = r0.get("ds_facts") or {}
    if f:
        off = ", ".join(f"{k}={v}" for k, v in (f.get("offload") or {}).items()) or "none"
        lines.append(f"DeepSpeed: ZeRO-{f.get('stage')}, {f.get('precision')}, accumulation {f.get('accumulation')}"
                     f" (asked {f.get('accumulation_asked')}), offload {off}, optimizer {r0.get('optimizer') or f.get('optimizer')}")
    lines += [f"  {n}" for n in r0.get("ds_notes") or []]
    b = r0.get("build") or {}
    if b and f.get("stage") == 3:
        lines.append(f"zero.Init: {b.get('partitioned')}/{b.get('params')} parameters partitioned"
                     + (f", {b.get('empty_local')} empty on each rank until gathered" if "empty_local" in b else ""))
    if r0.get("losses"):
        lines.append("losses (rank 0): " + ", ".join(f"{x:.4f}" for x in r0["losses"]))
        if not r0.get("moe") and r0.get("baseline_loss") is not None:
            d = abs(r0["losses"][0] - r0["baseline_loss"])
            lines.append(f"first ZeRO-3 loss vs. the same batch without DeepSpeed: {r0['losses'][0]:.6f} vs "
                         f"{r0['baseline_loss']:.6f} (|diff| {d:.2e})")
    st = r0.get("steps") or {}
    if st:
        lines.append("step times (s): " + ", ".join(f"{k} {v:.2f}" for k, v in st.items()))
    return lines


def _save_findings(r0: dict, stage) -> list[Finding]:
    save = r0.get("save") or {}
    rel = r0.get("reload") or {}
    out = []
    if not save.get("saved"):
        empty = save.get("state_dict_empty") or []
        total = save.get("state_dict_tensors")
        out.append(Finding(
            _codes.ZERO3_EMPTY_SAVE,
            "engine.save_16bit_model() saved nothing: stage3_gather_16bit_weights_on_model_save is false, so the "
            "HF Trainer's final save has no consolidated weights"
            + (f"; the model's own state_dict holds {len(empty)} of {total} tensors as torch.Size([0]) (ZeRO-3 "
               "partitions) — what save_pretrained writes without the gather" if empty else ""),
            SAVE_FIX))
        return out
    if rel.get("empty"):
        out.append(Finding(_codes.ZERO3_EMPTY_SAVE, f"the 16-bit save wrote {len(rel['empty'])} empty tensors "
                           f"(torch.Size([0])): {', '.join(rel['empty'][:5])}", SAVE_FIX))
    if rel.get("missing"):
        out.append(Finding(_codes.ZERO3_EMPTY_SAVE, f"the 16-bit save lacks {len(rel['missing'])} parameters: "
                           f"{', '.join(rel['missing'][:5])}", SAVE_FIX))
    if rel.get("mismatched"):
        m = rel["mismatched"][0]
        out.append(Finding(_codes.ZERO3_EMPTY_SAVE, f"the reloaded weights differ from the gathered ones for "
                           f"{len(rel['mismatched'])} tensors (first: {m['name']}, max |diff| {m['max_abs_diff']:.3g}, "
                           f"shape {m['saved_shape']} vs {m['shape']})",
                           "Save with engine.save_16bit_model / the HF Trainer under ZeRO-3 (not a plain state_dict), "
                           "or rebuild the weights with zero_to_fp32.py."))
    if rel.get("fresh_missing") or rel.get("fresh_unexpected"):
        out.append(Finding(_codes.ZERO3_EMPTY_SAVE,
                           f"loading the saved weights into a fresh copy of the model: missing {rel.get('fresh_missing')[:5]}, "
                           f"unexpected {rel.get('fresh_unexpected')[:5]} — from_pretrained would re-initialise the "
                           "missing ones", "Check tied/renamed weights in the model code (tie_word_embeddings, "
                           "_tied_weights_keys) and save with the HF Trainer.", Status.WARN))
    return out


def _moe_verdict(res, ranks: dict, r0: dict, model: str) -> tuple[list[Finding], list[str], str]:
    if not r0.get("moe"):
        return [], [], ""
    details = []
    cover = r0.get("moe_cover") or {}
    blocks = cover.get("blocks") or []
    covered = set(cover.get("by_llamafactory") or []) | set(cover.get("by_deepspeed_config") or [])
    used = {r: ranks[r].get("experts_used") for r in sorted(ranks)}
    details.append(f"MoE blocks: {', '.join(blocks) or 'none found'}; experts fired per rank with the forced routing: "
                   + "; ".join(f"rank {r}: {u}" for r, u in used.items()))
    details.append("leaf modules set by LLaMA-Factory 0.9.5 for this model type: "
                   + (", ".join(cover.get("by_llamafactory") or []) or "none")
                   + "; by the DeepSpeed config's leaf_module list: "
                   + (", ".join(cover.get("by_deepspeed_config") or []) or "none"))
    fused = (r0.get("build") or {}).get("fused_experts")
    nl = [ranks[r].get("no_leaf") for r in sorted(ranks) if ranks[r].get("no_leaf")]
    stage = (r0.get("ds_facts") or {}).get("stage")
    if stage != 3:
        return [], details + [f"ZeRO-{stage} keeps whole weights on every rank: leaf modules do not matter"], ""
    if not nl:
        return [], details + ["the run without leaf modules did not start"], ""
    limit = nl[0].get("limit_s")
    errors = [(r, ranks[r]["no_leaf"]["error"]) for r in sorted(ranks)
              if (ranks[r].get("no_leaf") or {}).get("error")]
    hung = [r for r in sorted(ranks) if (ranks[r].get("no_leaf") or {}).get("hung")]
    unfinished = [r for r in res.ranks if r not in ranks or not (ranks[r].get("no_leaf") or {}).get("finished")
                  and not (ranks[r].get("no_leaf") or {}).get("hung")]
    mismatch_line = next((ln.strip() for ln in res.log.splitlines()
                          if "collective mismatch" in ln or "doesn't match expected size" in ln), None)
    if mismatch_line and "Received data size" in mismatch_line:
        mismatch_line = "gloo: " + mismatch_line[mismatch_line.index("Received data size"):]
    if not errors and not hung and not unfinished:
        why = ("its experts are stacked in one module, so every expert's weights are gathered together whichever "
               "experts fire" if fused else "the ranks stayed in step")
        details.append(f"without any leaf module the forced routing ran through 2 steps ({nl[0].get('after_s')} s): {why}")
        return [], details, "MoE without leaf modules: no hang"
    watchdog = next((ln.strip() for ln in res.log.splitlines() if "Watchdog caught collective operation timeout" in ln), None)
    if mismatch_line:
        died = f"rank(s) {unfinished} aborted" if unfinished else "a rank failed"
        what = f"desynchronised: {died} on a collective mismatch ({mismatch_line[:220]})"
    elif errors:  # the first rank's own error; the others' hangs follow from it
        r, e = errors[0]
        what = f"failed on rank {r} in {e['step']}: {e['error_type']}: {e['error'][:200]}"
    elif hung:
        what = (f"hung: ranks {hung} were still waiting after {limit:.0f} s "
                f"(last step {', '.join(str((ranks[r].get('no_leaf') or {}).get('phase')) for r in hung)})")
    elif res.timed_out or watchdog:
        what = (f"hung: rank(s) {unfinished} never finished" + (f" until the NCCL watchdog fired ({watchdog[:160]})"
                                                                 if watchdog else f" within {res.wall_s:.0f} s"))
    else:
        what = f"crashed: rank(s) {unfinished} died (exit code {res.returncode})"
    details.append(f"without leaf modules, ranks routing to different experts: {what}")
    details.append("with " + ", ".join(blocks) + " as ZeRO-3 leaf modules the same routing trained, saved and reloaded")
    if set(blocks) <= covered:
        details.append("your run is protected: " + ", ".join(sorted(covered)) + " set as leaf modules "
                       "(LLaMA-Factory/DeepSpeed)")
        return [], details, "MoE leaf modules needed, and set for this model"
    names = ", ".join(blocks)
    f = Finding(
        _codes.ZERO3_MOE_LEAF,
        f"the MoE block {names} is not a ZeRO-3 leaf module in this run (neither LLaMA-Factory 0.9.5 nor the "
        f"DeepSpeed config sets it): with tokens routed to different experts on different ranks the ZeRO-3 run {what}. "
        f"On GPUs (NCCL) this is the hang that ends at the watchdog time-out; marked as leaf modules, the same run passed",
        f"Add to the DeepSpeed config (DeepSpeed >= 0.18): \"zero_optimization\": {{\"leaf_module\": {{\"classes\": "
        f"[{', '.join(repr(b).replace(chr(39), chr(34)) for b in blocks)}]}}}}; or call "
        f"deepspeed.utils.set_z3_leaf_modules(model, [{names}]) before training (LLaMA-Factory: add the model type to "
        "model_utils/moe.py:add_z3_leaf_module); or train it with ZeRO-2.")
    return [f], details, "MoE leaf modules needed and not set"


def _judge_failure(res, r0, failure: dict, backend: str, model: str, findings, details, metrics):
    step = failure.get("step")
    err = f"{failure.get('error_type')}: {failure.get('error', '')}"
    frame = failure.get("frame")
    where = _frame_text(frame)
    details.append(f"failed in step '{step}': {err[:600]}")
    if where:
        details.append(f"at {frame.get('file')}:{frame.get('line')} ({frame.get('function')})")
    details += ["traceback (tail):", *("  " + ln for ln in (failure.get("traceback") or "").strip().splitlines()[-14:])]
    low = err.lower()
    if step == "import":
        return skip(f"torch/deepspeed/transformers cannot be imported ({err[:200]})", findings, metrics, details)
    if step == "load_config":
        if "trust_remote_code" in low or "custom code" in low:
            return skip(f"{model} needs its own Python code (auto_map in config.json); rerun with "
                        "--trust-remote-code to let the doctor run it", findings, metrics, details)
        return skip(f"transformers cannot read the model's config ({err[:200]})", findings, metrics, details)
    if step in ("shrink", "baseline", "load_tokenizer"):
        return verdict(f"not tested: the shrunk copy of {r0.get('model_type')} does not run even without "
                       f"DeepSpeed ({err[:160]}); no ZeRO-3 verdict", findings, metrics, details, status=Status.WARN)
    if step == "init_distributed":
        fs, ds = launch_failure_findings(res, f"the {backend} process group for the ZeRO-3 run", _codes.COLLECTIVE_HANG,
                                         _codes.RANK_DIED, "nccl.allreduce tests the ranks alone.")
        return verdict("the ranks could not form a process group", findings + fs, metrics, details + ds,
                       status=Status.FAIL)
    hostile = _is_model_code(frame) and (step == "zero_init" or any(h in low for h in SIZE_ZERO_HINTS))
    if step == "zero_init" or hostile:
        what = ("while building it under deepspeed.zero.Init" if step == "zero_init"
                else f"in {step.replace('_', ' ')} under ZeRO-3")
        findings.append(Finding(
            _codes.ZERO3_MODEL_CODE,
            f"the model's code fails {what}, where each weight is an empty partition (torch.Size([0])) until ZeRO-3 "
            f"gathers it for the module that owns it: {err[:300]}" + (f" — at {where}" if where else "")
            + " (the same code runs without DeepSpeed)",
            "Change the model code so it touches weights only inside the owning module's forward, or gathers them "
            "first: wrap the access in `with deepspeed.zero.GatheredParameters([param], modifier_rank=0):` "
            "(modifications in __init__/post_init), call submodules instead of reading their .weight, or register "
            "the weight with deepspeed.zero.register_external_parameter(module, param). Or train with ZeRO-2, "
            "which never partitions weights."))
        return verdict(f"{r0.get('model_type')}: the model's code is not ZeRO-3-safe ({step})", findings,
                       metrics, details, status=Status.FAIL)
    # DeepSpeed refused the config, an op failed to build, or a step failed for another reason:
    # explain the launch log the way a training log would be explained
    # an unexplained error in the model's own code under ZeRO-3 is the model's; anything else (a
    # config DeepSpeed refuses, an op that does not build) keeps the generic code
    died = _codes.ZERO3_MODEL_CODE if _is_model_code(frame) else _codes.RANK_DIED
    fs, ds = launch_failure_findings(res, f"the ZeRO-3 run of {model} (step '{step}')", _codes.COLLECTIVE_HANG,
                                     died, "Read the rank's error above; -v shows the traceback.")
    if fs and fs[-1].code == _codes.ZERO3_MODEL_CODE and where:
        fs[-1].message += f" — at {where}"
    return verdict(f"{r0.get('model_type')}: the ZeRO-3 run failed in step '{step}'", findings + fs, metrics,
                   details + ds[2:], status=Status.FAIL)


PROBE = Probe(ID, TITLE, run, needs=("nccl.allreduce",), slow=True, applies=applies, ranks=True,
              hint="real ZeRO-3 steps, a save and a reload on this machine's ranks")
