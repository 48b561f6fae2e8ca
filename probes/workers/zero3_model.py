"""Rank-side zero3.model: the user's architecture, shrunk, trained for real under DeepSpeed.

Each rank: read the model's config (only config.json, never weights), shrink it, build it once
plainly (a baseline: does the shrunk model run at all?), then under the DeepSpeed config with
deepspeed.zero.Init (transformers' own ZeRO-3 path, as from_pretrained takes it): forward,
backward, optimizer step, a second step with the config's gradient accumulation, a 16-bit
consolidated save, and a reload whose weights are compared with the gathered ones. For MoE
models the routing is forced apart (rank 0's tokens go to the first top-k experts, rank 1's to
all of them) with the MoE blocks set as ZeRO-3 leaf modules as LLaMA-Factory sets them; then,
last, the same model without any leaf modules under a short inner time limit (a hang there is
the point of the check: the result is written before it starts).

A failure is reported with the step it happened in, and the frame of the model's own code that
raised (the deepest frame outside torch/deepspeed/transformers' plumbing)."""

import gc
import math
import os
import sys
import threading
import time
import traceback
from datetime import timedelta

WORKERS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, WORKERS_DIR)
from _protocol import Worker, error_fields, leave
from _ds_config import fill_ds_config
from _moe import (DEEPSPEED_DEFAULT_LEAF, force_routing, fused_experts, is_moe, llamafactory_leaf_classes, moe_blocks,
                  num_experts)
from _shrink import shrink_config, shrunk_hidden

SEQ_LEN = 16
SAMPLE_TEXT = ("The doctor builds a tiny copy of the model and trains it for two steps under ZeRO-3, "
               "then saves it and loads it back to compare every weight.")
PLUMBING = (os.sep + "torch" + os.sep, os.sep + "deepspeed" + os.sep, os.sep + "accelerate" + os.sep,
            WORKERS_DIR + os.sep,  # this worker's own frames (its steps, the routing hooks of _moe.py)
            os.sep + "contextlib.py", os.sep + "functools.py")
TRANSFORMERS_GENERIC = ("modeling_utils.py", "configuration_utils.py", "integrations" + os.sep,
                        "utils" + os.sep + "generic.py", "dynamic_module_utils.py", "auto_factory.py",
                        "utils" + os.sep + "import_utils.py", "modeling_layers.py")


class StepFailed(Exception):
    def __init__(self, step, exc):
        super().__init__(str(exc))
        self.step = step
        self.exc = exc


def model_frame(tb) -> dict | None:
    """The deepest frame of the model's own code (modeling_*.py, remote code) in a traceback,
    else the deepest frame outside torch/deepspeed."""
    frames = traceback.extract_tb(tb)
    own = [f for f in frames if not any(p in f.filename for p in PLUMBING)]
    model = [f for f in own if not any(p in f.filename for p in TRANSFORMERS_GENERIC)]
    pick = (model or own or frames or [None])[-1]
    if pick is None:
        return None
    return {"file": pick.filename, "line": pick.lineno, "function": pick.name, "code": (pick.line or "").strip()}


def failure(step, exc) -> dict:
    """The error of a step, with the frame of the model's own code that raised it."""
    return {"step": step, **error_fields(exc, error_chars=2000, traceback_chars=6000),
            "frame": model_frame(exc.__traceback__)}


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted(_jsonable(v) for v in x)
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)


class Run:
    """One rank's run: timings per step, and the result written as it goes."""

    def __init__(self, w: Worker):
        self.w = w
        self.a = w.args
        self.out = {"steps": {}, "rank": w.rank}
        self.t_start = time.perf_counter()

    def step(self, name, fn, *args, **kwargs):
        self.w.phase(name)
        t0 = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:  # reported with the step's name
            raise StepFailed(name, exc) from exc
        self.out["steps"][name] = round(time.perf_counter() - t0, 3)
        return value

    def write(self, ok=True):
        payload = dict(self.out)
        payload["ok"] = ok
        payload["wall_s"] = round(time.perf_counter() - self.t_start, 3)
        payload["phases"] = self.w.phases
        self.w.write_result(_jsonable(payload))


def body(run: Run) -> None:
    a = run.a
    w = run.w
    out = run.out

    def imports():
        import deepspeed
        import torch
        import transformers
        from transformers.integrations import HfDeepSpeedConfig  # noqa: F401

        out["versions"] = {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                           "transformers": transformers.__version__}

    run.step("import", imports)
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM

    trust = bool(a.get("trust_remote_code"))
    model_ref = a["model"]
    on_gpu = a.get("backend") == "nccl"

    def load_config():
        if os.path.isdir(model_ref):
            return AutoConfig.from_pretrained(model_ref, trust_remote_code=trust)
        given = a.get("config_dict") or {}
        if trust and given.get("auto_map"):
            # the repository's own code, fetched from the hub (HF_HUB_CACHE is the doctor's cache)
            return AutoConfig.from_pretrained(model_ref, trust_remote_code=True)
        from transformers import CONFIG_MAPPING

        model_type = given.get("model_type")
        if model_type not in CONFIG_MAPPING:
            if given.get("auto_map"):
                raise ValueError(f"{model_ref} contains custom code (auto_map) which must be executed to load "
                                 "the model: it needs trust_remote_code=True")
            raise ValueError(f"model_type {model_type!r} is not known to transformers {__import__('transformers').__version__}")
        return CONFIG_MAPPING[model_type].from_dict(given)

    config = run.step("load_config", load_config)
    orig = config.to_dict()
    text = orig.get("text_config") if isinstance(orig.get("text_config"), dict) else {}
    out["model_type"] = orig.get("model_type")
    out["text_model_type"] = text.get("model_type")
    out["architectures"] = orig.get("architectures")
    out["quantization_config"] = orig.get("quantization_config")
    out["auto_map"] = orig.get("auto_map")
    moe = is_moe(orig)
    out["moe"] = moe

    tokenizer = None
    if a.get("use_tokenizer") and os.path.isdir(model_ref):
        def load_tokenizer():
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(model_ref, trust_remote_code=trust)

        try:
            tokenizer = run.step("load_tokenizer", load_tokenizer)
            out["tokenizer"] = {"class": type(tokenizer).__name__, "len": len(tokenizer)}
        except StepFailed as exc:
            out["tokenizer_error"] = f"{type(exc.exc).__name__}: {exc}"[:500]

    def shrink():
        small, notes = shrink_config(orig, keep_vocab=tokenizer is not None)
        cls = type(config)
        small_cfg = cls.from_dict(small)
        small_cfg._name_or_path = config._name_or_path  # remote code is found through it
        return small_cfg, small, notes

    small_config, small_dict, notes = run.step("shrink", shrink)
    out["shrink_notes"] = notes
    vocab = getattr(small_config, "vocab_size", None) or getattr(getattr(small_config, "text_config", None),
                                                                   "vocab_size", None) or 256
    out["vocab_size"] = vocab
    hidden = shrunk_hidden(small_dict)
    n_experts = num_experts(small_dict)

    def init_dist():
        if on_gpu:
            torch.cuda.set_device(w.local_rank)
        deepspeed.init_distributed(dist_backend=a.get("backend", "gloo"),
                                   timeout=timedelta(seconds=float(a.get("pg_timeout", 300))))

    run.step("init_distributed", init_dist)
    device = torch.device("cuda", w.local_rank) if on_gpu else torch.device("cpu")
    world = dist.get_world_size()

    # inputs: different on each rank (as data parallelism has them)
    if tokenizer is not None:
        ids = tokenizer(SAMPLE_TEXT, return_tensors="pt")["input_ids"][:, :SEQ_LEN * 2]
        out["tokenizer_max_id"] = int(ids.max())
        if int(ids.max()) >= vocab:
            out["tokenizer_beyond_vocab"] = True
            ids = ids.clamp(max=vocab - 1)
        fixed_ids = ids
    else:
        fixed_ids = None

    def batch(i):
        if fixed_ids is not None:
            shift = (w.rank * 3 + i) % max(1, fixed_ids.shape[1] - SEQ_LEN + 1)
            x = fixed_ids[:, shift:shift + SEQ_LEN]
        else:
            gen = torch.Generator().manual_seed(1000 + 100 * w.rank + i)
            x = torch.randint(0, vocab, (1, SEQ_LEN), generator=gen)
        return x.to(device)

    auto_class = AutoModelForCausalLM

    def baseline():
        torch.manual_seed(0)
        model = auto_class.from_config(small_config, trust_remote_code=trust, dtype=torch.float32)
        model.to(device)
        model.train()
        x = batch(0)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        out["baseline_loss"] = float(loss.detach())
        out["moe_block_classes"] = sorted({type(b).__name__ for _, b in moe_blocks(model)})
        out["params"] = int(sum(p.numel() for p in model.parameters()))
        return model

    plain = run.step("baseline", baseline)
    if w.rank != 0:
        del plain
        plain = None
    else:
        plain.cpu()

    ds_config, facts, ds_notes = fill_ds_config(
        a.get("ds_config"), yaml=a.get("yaml") or {}, world_size=world, hidden_size=hidden, on_gpu=on_gpu,
        bf16_ok=bool(a.get("bf16_ok")), scratch_dir=a["scratch"])
    out["ds_facts"] = facts
    out["ds_notes"] = ds_notes
    out["ds_config"] = ds_config
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(facts["precision"], torch.float32)
    stage = facts["stage"]
    yaml = a.get("yaml") or {}
    lf_leaf = llamafactory_leaf_classes(out["model_type"], out["text_model_type"])
    out["llamafactory_leaf"] = lf_leaf

    state = {}

    def build(cfg, leaf_names):
        from transformers.integrations import HfDeepSpeedConfig

        state["hf_ds"] = HfDeepSpeedConfig(cfg)  # transformers sees ZeRO-3: from_config runs zero.Init
        torch.manual_seed(0)
        model = auto_class.from_config(small_config, trust_remote_code=trust, dtype=dtype)
        load_weights(model)
        info = {"partitioned": sum(1 for p in model.parameters() if hasattr(p, "ds_id")),
                "params": sum(1 for _ in model.parameters())}
        if stage == 3:
            info["empty_local"] = sum(1 for p in model.parameters() if hasattr(p, "ds_id") and p.numel() == 0)
        blocks = moe_blocks(model)
        info["moe_blocks"] = sorted({f"{type(b).__module__}.{type(b).__qualname__}" for _, b in blocks})
        info["fused_experts"] = bool(blocks) and all(fused_experts(b) for _, b in blocks)
        matched = []
        if leaf_names:
            from deepspeed.utils import set_z3_leaf_modules

            matched = set_z3_leaf_modules(model, list(leaf_names), raise_if_not_found=False)
        info["leaf_set"] = sorted({type(m).__name__ for m in matched})
        if not yaml.get("disable_gradient_checkpointing") and getattr(model, "supports_gradient_checkpointing", False):
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": bool(yaml.get("use_reentrant_gc", True))})
            info["gradient_checkpointing"] = True
        model.config.use_cache = False
        return model, info, blocks

    def load_weights(model):
        """Rank 0's baseline weights into the partitioned model, as from_pretrained loads a
        checkpoint under ZeRO-3 (gather with rank 0 as the modifier, copy, re-partition)."""
        params = dict(model.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=0, enabled=stage == 3):
            if w.rank == 0 and plain is not None:
                src = dict(plain.named_parameters())
                with torch.no_grad():
                    for n, p in params.items():
                        if n in src and src[n].shape == p.shape:
                            p.copy_(src[n].to(p.dtype))
        if stage != 3:  # every rank holds full weights: make them rank 0's
            with torch.no_grad():
                for p in params.values():
                    dist.broadcast(p.data, 0)

    def make_engine(model, cfg):
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = None
        if facts["optimizer"] == "torch-adamw":
            optimizer = torch.optim.AdamW(params, lr=facts["lr"])
        elif facts["optimizer"] == "ds-cpu-adam":  # what accelerate maps torch AdamW to under offload
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(params, lr=facts["lr"])
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=params,
                                                 config=cfg)
        return engine, type(opt).__name__ + (f"({type(opt.optimizer).__name__})" if hasattr(opt, "optimizer") else "")

    def train_step(engine, n_micro, tag):
        losses = []
        for i in range(n_micro):
            x = batch(i)
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach().float()))
        if not all(math.isfinite(v) for v in losses):
            raise FloatingPointError(f"{tag}: loss is not finite: {losses}")
        return losses

    # ---- run A: the user's run; MoE blocks as ZeRO-3 leaf modules (LLaMA-Factory's and the detected ones) ----
    leaf_a = list(dict.fromkeys(lf_leaf + out.get("moe_block_classes", []))) if moe else lf_leaf
    model, info, blocks = run.step("zero_init", build, ds_config, leaf_a)
    out["build"] = info
    if moe:
        block_classes = sorted({type(b).__name__ for _, b in blocks})
        ds_leaf = (ds_config.get("zero_optimization") or {}).get("leaf_module")
        ds_classes = DEEPSPEED_DEFAULT_LEAF if ds_leaf is None else tuple(
            str(c).rsplit(".", 1)[-1] for c in ((ds_leaf or {}).get("classes") or []))
        out["moe_cover"] = {"blocks": block_classes,
                            "by_llamafactory": [c for c in block_classes if c in lf_leaf],
                            "by_deepspeed_config": [c for c in block_classes if c in ds_classes]}
    used = set()
    hooks = force_routing(blocks, n_experts, w.rank, torch, used) if moe else []
    out["routing_forced"] = len(hooks)
    engine, opt_name = run.step("deepspeed_initialize", make_engine, model, ds_config)
    out["optimizer"] = opt_name
    probe_names = [n for n, _ in model.named_parameters()]
    probe_names = [probe_names[0], probe_names[-1]]
    before = gathered(model, probe_names, deepspeed, stage)
    ga = facts["accumulation"]
    out["losses"] = run.step("step_1", train_step, engine, ga, "step 1")
    out["losses"] += run.step("step_2_accumulation", train_step, engine, ga, "step 2")
    after = gathered(model, probe_names, deepspeed, stage)
    out["global_steps"] = int(engine.global_steps)
    out["params_changed"] = {n: bool(not torch.equal(before[n], after[n])) for n in probe_names}

    def gather_all():
        params = dict(model.named_parameters())
        snap = {}
        with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None, enabled=stage == 3):
            if w.rank == 0:
                snap = {n: p.detach().cpu().clone() for n, p in params.items()}
        return snap

    snapshot = run.step("gather", gather_all)
    save_dir = os.path.join(a["scratch"], "save16")

    def save():
        saved = engine.save_16bit_model(save_dir)
        info = {"saved": bool(saved)}
        if not saved and w.rank == 0:
            # what save_pretrained / a plain state_dict would write instead: the local partitions
            sd = engine.module.state_dict()
            info["state_dict_empty"] = sorted(k for k, v in sd.items() if v.numel() == 0)
            info["state_dict_tensors"] = len(sd)
        return info

    out["save"] = run.step("save_16bit", save)

    def reload():
        path = os.path.join(save_dir, "pytorch_model.bin")
        rep = {"path_exists": os.path.exists(path)}
        if w.rank != 0 or not rep["path_exists"]:
            return rep
        sd = torch.load(path, map_location="cpu", weights_only=True)
        rep["saved_tensors"] = len(sd)
        rep["saved_bytes"] = os.path.getsize(path)
        rep["empty"] = sorted(k for k, v in sd.items() if v.numel() == 0 and snapshot.get(k, v).numel() > 0)
        rep["missing"] = sorted(n for n in snapshot if n not in sd)
        mismatched = []
        for n, ref in snapshot.items():
            got = sd.get(n)
            if got is None or got.numel() == 0:
                continue
            if got.shape != ref.shape or not torch.equal(got.to(ref.dtype), ref):
                diff = float((got.float() - ref.float()).abs().max()) if got.shape == ref.shape else float("inf")
                mismatched.append({"name": n, "saved_shape": list(got.shape), "shape": list(ref.shape),
                                   "max_abs_diff": diff})
        rep["mismatched"] = mismatched[:20]
        rep["compared"] = sum(1 for n in snapshot if n in sd)
        # the saved weights into a fresh copy of the architecture, as from_pretrained would
        if plain is not None:
            res = plain.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()}, strict=False)
            # a key missing from the file is fine when its tensor is tied to one that was loaded
            fresh_sd = plain.state_dict(keep_vars=True)
            loaded_ptrs = {fresh_sd[k].data_ptr() for k in sd if k in fresh_sd}
            rep["fresh_missing"] = sorted(k for k in res.missing_keys
                                          if k in fresh_sd and fresh_sd[k].data_ptr() not in loaded_ptrs
                                          and k in dict(plain.named_parameters(remove_duplicate=False)))
            rep["fresh_unexpected"] = sorted(res.unexpected_keys)
            fresh = dict(plain.named_parameters())
            rep["fresh_differ"] = sorted(n for n, ref in snapshot.items()
                                         if n in fresh and not torch.equal(fresh[n].detach(), ref.float()))[:20]
        return rep

    out["reload"] = run.step("reload_compare", reload)
    dist.barrier()
    for h in hooks:
        h.remove()
    out["experts_used"] = sorted(used)

    if not (moe and a.get("moe_check") and stage == 3):
        return
    # ---- run B: the same MoE model without any ZeRO-3 leaf module, routing forced apart ----
    engine = model = blocks = snapshot = None  # free run A before run B
    state.clear()
    gc.collect()
    import copy

    cfg_b = copy.deepcopy(ds_config)
    cfg_b["zero_optimization"]["leaf_module"] = {"classes": [], "names": [], "name_suffixes": []}
    # a few times what the same work took with leaf modules, within the probe's cap
    took_a = sum(out["steps"].get(k, 0) for k in ("zero_init", "deepspeed_initialize", "step_1", "step_2_accumulation"))
    limit = min(float(a.get("moe_limit_s", 45)), max(10.0, 4 * took_a))
    out["no_leaf"] = {"started": True, "finished": False, "limit_s": round(limit, 1)}
    run.write(ok=True)  # A's result stands even if B hangs or crashes and this rank is killed
    t_b = time.perf_counter()

    def on_timeout():
        out["no_leaf"].update({"hung": True, "phase": w.phases[-1][0] if w.phases else None,
                               "after_s": round(time.perf_counter() - t_b, 1)})
        run.write(ok=True)
        leave(0)

    timer = threading.Timer(limit, on_timeout)
    timer.daemon = True
    timer.start()
    try:
        model_b, info_b, blocks_b = run.step("no_leaf_zero_init", build, cfg_b, [])
        out["no_leaf"]["build"] = info_b
        used_b = set()
        force_routing(blocks_b, n_experts, w.rank, torch, used_b)
        engine_b, _ = run.step("no_leaf_deepspeed_initialize", make_engine, model_b, cfg_b)
        out["no_leaf"]["losses"] = run.step("no_leaf_steps", train_step, engine_b, 2, "no-leaf steps")
        out["no_leaf"]["experts_used"] = sorted(used_b)
        w.phase("no_leaf_barrier")
        dist.barrier()
    except StepFailed as exc:
        timer.cancel()
        out["no_leaf"].update({"finished": True, "error": failure(exc.step, exc.exc)})
        run.write(ok=True)
        leave(0)  # no barrier: the other rank may sit in a collective that never completes
    timer.cancel()
    out["no_leaf"].update({"finished": True, "hung": False, "after_s": round(time.perf_counter() - t_b, 1)})


def gathered(model, names, deepspeed, stage):
    params = dict(model.named_parameters())
    sel = [params[n] for n in names]
    with deepspeed.zero.GatheredParameters(sel, modifier_rank=None, enabled=stage == 3):
        return {n: params[n].detach().float().cpu().clone() for n in names}


def main() -> None:
    w = Worker()
    w.args.setdefault("scratch", os.path.join(os.path.dirname(os.path.abspath(w.outdir)), "scratch"))
    os.makedirs(w.args["scratch"], exist_ok=True)
    run = Run(w)
    try:
        body(run)
    except StepFailed as exc:
        run.out["failure"] = failure(exc.step, exc.exc)
        run.write(ok=False)
        traceback.print_exception(type(exc.exc), exc.exc, exc.exc.__traceback__)
        leave(1)
    except BaseException as exc:  # noqa: BLE001 - the worker's own bug: still a report
        run.out["failure"] = failure("worker", exc)
        run.write(ok=False)
        traceback.print_exc()
        leave(1)
    run.write(ok=True)
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
    finally:
        leave(0)


if __name__ == "__main__":
    main()
