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

import copy
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
from _extensions import extensions_tag
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
    """One rank's run: its arguments, what the steps found so far (their timings, and what later
    steps need), and the result written as it goes. prepare() sets trust, model_ref, on_gpu,
    config, orig, moe, tokenizer, small_config, vocab, hidden, n_experts, device, world,
    fixed_ids and plain; fill_config() sets ds_config, facts, dtype, stage, yaml and lf_leaf."""

    def __init__(self, w: Worker):
        self.w = w
        self.a = w.args
        self.out = {"steps": {}, "rank": w.rank}
        self.t_start = time.perf_counter()
        self.tokenizer = None
        self.plain = None  # rank 0's baseline model: its weights seed the ZeRO-3 model, the reload goes into it
        self.hf_ds = None  # transformers holds only a weak reference to the HfDeepSpeedConfig

    def step(self, name, fn, *args, **kwargs):
        """fn(*args, **kwargs), timed under `name`; a failure is reported with the step's name."""
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


# ---- preparing: the stack, the model's config shrunk, the ranks, a plain baseline ------------------

def import_stack(run: Run) -> None:
    import deepspeed
    import torch
    import transformers
    from transformers.integrations import HfDeepSpeedConfig  # noqa: F401

    run.out["versions"] = {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                           "transformers": transformers.__version__}


def load_config(run: Run):
    """The model's config: from its folder, from the hub with its own code, or from the dict the
    doctor read (transformers' built-in class of its model_type)."""
    from transformers import AutoConfig

    a, model_ref, trust = run.a, run.model_ref, run.trust
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


def describe_model(run: Run) -> None:
    orig = run.orig = run.config.to_dict()
    text = orig.get("text_config") if isinstance(orig.get("text_config"), dict) else {}
    out = run.out
    out["model_type"] = orig.get("model_type")
    out["text_model_type"] = text.get("model_type")
    out["architectures"] = orig.get("architectures")
    out["quantization_config"] = orig.get("quantization_config")
    out["auto_map"] = orig.get("auto_map")
    run.moe = out["moe"] = is_moe(orig)


def load_tokenizer(run: Run):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(run.model_ref, trust_remote_code=run.trust)


def shrink(run: Run):
    small, notes = shrink_config(run.orig, keep_vocab=run.tokenizer is not None)
    small_cfg = type(run.config).from_dict(small)
    small_cfg._name_or_path = run.config._name_or_path  # remote code is found through it
    return small_cfg, small, notes


def init_distributed(run: Run) -> None:
    import deepspeed
    import torch

    if run.on_gpu:
        torch.cuda.set_device(run.w.local_rank)
    own_extensions_dir(torch, deepspeed)
    if run.a.get("skip_shm_op"):
        # DeepSpeed's CPU accelerator JIT-builds its shared-memory all-reduce (deepspeed_shm_comm) in
        # TorchBackend.__init__ (deepspeed/comm/torch.py build_shm_op), for inference_all_reduce only: a
        # cold build costs tens of seconds to minutes. The stand-in gloo run of a GPU host never needs it
        # (the run itself is NCCL on the CUDA accelerator, which has no such op).
        import importlib

        # by name: `import deepspeed.comm.torch as m` binds torch itself (deepspeed.comm has a `torch` attribute)
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend=run.a.get("backend", "gloo"),
                               timeout=timedelta(seconds=float(run.a.get("pg_timeout", 300))))


def own_extensions_dir(torch, deepspeed) -> None:
    """TORCH_EXTENSIONS_DIR (the doctor's cache) per Python, torch, DeepSpeed and accelerator, as
    deepspeed.ops' worker keeps it: one folder shared by builds with other flags is rebuilt at every
    switch (torch's JIT compares build.ninja), which the ninja log of a shared folder shows."""
    base = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not base:
        return
    accelerator = os.environ.get("DS_ACCELERATOR") or ("cuda" if torch.cuda.is_available() else "cpu")
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(base, extensions_tag(torch, deepspeed, accelerator))


def tokenized_sample(run: Run):
    """SAMPLE_TEXT through the model's own tokenizer (ids past the shrunk vocabulary clamped), or None."""
    if run.tokenizer is None:
        return None
    ids = run.tokenizer(SAMPLE_TEXT, return_tensors="pt")["input_ids"][:, :SEQ_LEN * 2]
    run.out["tokenizer_max_id"] = int(ids.max())
    if int(ids.max()) >= run.vocab:
        run.out["tokenizer_beyond_vocab"] = True
        ids = ids.clamp(max=run.vocab - 1)
    return ids


def batch(run: Run, i: int):
    """Micro-batch i: different on each rank (as data parallelism has them)."""
    import torch

    if run.fixed_ids is not None:
        shift = (run.w.rank * 3 + i) % max(1, run.fixed_ids.shape[1] - SEQ_LEN + 1)
        x = run.fixed_ids[:, shift:shift + SEQ_LEN]
    else:
        gen = torch.Generator().manual_seed(1000 + 100 * run.w.rank + i)
        x = torch.randint(0, run.vocab, (1, SEQ_LEN), generator=gen)
    return x.to(run.device)


def baseline(run: Run):
    """The shrunk model without DeepSpeed: does it run at all? (A failure here is not ZeRO-3's.)"""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(run.small_config, trust_remote_code=run.trust, dtype=torch.float32)
    model.to(run.device)
    model.train()
    x = batch(run, 0)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    run.out["baseline_loss"] = float(loss.detach())
    run.out["moe_block_classes"] = sorted({type(b).__name__ for _, b in moe_blocks(model)})
    run.out["params"] = int(sum(p.numel() for p in model.parameters()))
    return model


def fill_config(run: Run) -> None:
    """The DeepSpeed config to run, filled as the HF Trainer fills it, and LLaMA-Factory's leaf classes."""
    import torch

    a, out = run.a, run.out
    run.ds_config, run.facts, ds_notes = fill_ds_config(
        a.get("ds_config"), yaml=a.get("yaml") or {}, world_size=run.world, hidden_size=run.hidden,
        on_gpu=run.on_gpu, bf16_ok=bool(a.get("bf16_ok")), scratch_dir=a["scratch"])
    out["ds_facts"] = run.facts
    out["ds_notes"] = ds_notes
    out["ds_config"] = run.ds_config
    run.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(run.facts["precision"], torch.float32)
    run.stage = run.facts["stage"]
    run.yaml = a.get("yaml") or {}
    run.lf_leaf = out["llamafactory_leaf"] = llamafactory_leaf_classes(out["model_type"], out["text_model_type"])


def prepare(run: Run) -> None:
    run.step("import", import_stack, run)
    import torch
    import torch.distributed as dist
    # transformers' lazy classes load here, outside the timed steps (the no-leaf run's time limit
    # is a multiple of their times)
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: F401

    a, out = run.a, run.out
    run.trust = bool(a.get("trust_remote_code"))
    run.model_ref = a["model"]
    run.on_gpu = a.get("backend") == "nccl"
    run.config = run.step("load_config", load_config, run)
    describe_model(run)
    if a.get("use_tokenizer") and os.path.isdir(run.model_ref):
        try:
            run.tokenizer = run.step("load_tokenizer", load_tokenizer, run)
            out["tokenizer"] = {"class": type(run.tokenizer).__name__, "len": len(run.tokenizer)}
        except StepFailed as exc:
            out["tokenizer_error"] = f"{type(exc.exc).__name__}: {exc}"[:500]
    run.small_config, small_dict, out["shrink_notes"] = run.step("shrink", shrink, run)
    cfg = run.small_config
    run.vocab = getattr(cfg, "vocab_size", None) or getattr(getattr(cfg, "text_config", None), "vocab_size", None) or 256
    out["vocab_size"] = run.vocab
    run.hidden = shrunk_hidden(small_dict)
    run.n_experts = num_experts(small_dict)
    run.step("init_distributed", init_distributed, run)
    run.device = torch.device("cuda", run.w.local_rank) if run.on_gpu else torch.device("cpu")
    run.world = dist.get_world_size()
    run.fixed_ids = tokenized_sample(run)
    plain = run.step("baseline", baseline, run)
    run.plain = plain.cpu() if run.w.rank == 0 else None
    del plain
    fill_config(run)


# ---- under ZeRO-3: build, train, gather, save, reload ---------------------------------------------

def zero_init(run: Run, cfg: dict, leaf_names):
    """The shrunk model built under deepspeed.zero.Init (transformers' own ZeRO-3 path), rank 0's
    baseline weights loaded, the given classes set as ZeRO-3 leaf modules. Returns (model, info, blocks)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    run.hf_ds = HfDeepSpeedConfig(cfg)  # transformers sees ZeRO-3: from_config runs zero.Init
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(run.small_config, trust_remote_code=run.trust, dtype=run.dtype)
    load_weights(run, model)
    info = {"partitioned": sum(1 for p in model.parameters() if hasattr(p, "ds_id")),
            "params": sum(1 for _ in model.parameters())}
    if run.stage == 3:
        info["empty_local"] = sum(1 for p in model.parameters() if hasattr(p, "ds_id") and p.numel() == 0)
    blocks = moe_blocks(model)
    info["moe_blocks"] = sorted({f"{type(b).__module__}.{type(b).__qualname__}" for _, b in blocks})
    info["fused_experts"] = bool(blocks) and all(fused_experts(b) for _, b in blocks)
    matched = []
    if leaf_names:
        from deepspeed.utils import set_z3_leaf_modules

        matched = set_z3_leaf_modules(model, list(leaf_names), raise_if_not_found=False)
    info["leaf_set"] = sorted({type(m).__name__ for m in matched})
    yaml = run.yaml
    if not yaml.get("disable_gradient_checkpointing") and getattr(model, "supports_gradient_checkpointing", False):
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": bool(yaml.get("use_reentrant_gc", True))})
        info["gradient_checkpointing"] = True
    model.config.use_cache = False
    return model, info, blocks


def load_weights(run: Run, model) -> None:
    """Rank 0's baseline weights into the partitioned model, as from_pretrained loads a
    checkpoint under ZeRO-3 (gather with rank 0 as the modifier, copy, re-partition)."""
    import deepspeed
    import torch
    import torch.distributed as dist

    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=0, enabled=run.stage == 3):
        if run.w.rank == 0 and run.plain is not None:
            src = dict(run.plain.named_parameters())
            with torch.no_grad():
                for n, p in params.items():
                    if n in src and src[n].shape == p.shape:
                        p.copy_(src[n].to(p.dtype))
    if run.stage != 3:  # every rank holds full weights: make them rank 0's
        with torch.no_grad():
            for p in params.values():
                dist.broadcast(p.data, 0)


def make_engine(run: Run, model, cfg: dict):
    """deepspeed.initialize with the optimizer the HF Trainer would hand it. Returns (engine, its optimizer's name)."""
    import deepspeed
    import torch

    facts = run.facts
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


def train_step(run: Run, engine, n_micro: int, tag: str) -> list[float]:
    losses = []
    for i in range(n_micro):
        x = batch(run, i)
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach().float()))
    if not all(math.isfinite(v) for v in losses):
        raise FloatingPointError(f"{tag}: loss is not finite: {losses}")
    return losses


def gathered(model, names, stage):
    import deepspeed

    params = dict(model.named_parameters())
    sel = [params[n] for n in names]
    with deepspeed.zero.GatheredParameters(sel, modifier_rank=None, enabled=stage == 3):
        return {n: params[n].detach().float().cpu().clone() for n in names}


def steps(run: Run, model, engine) -> None:
    """Two optimizer steps with the config's accumulation; did the first and last parameters change?"""
    import torch

    names = [n for n, _ in model.named_parameters()]
    names = [names[0], names[-1]]
    before = gathered(model, names, run.stage)
    ga = run.facts["accumulation"]
    run.out["losses"] = run.step("step_1", train_step, run, engine, ga, "step 1")
    run.out["losses"] += run.step("step_2_accumulation", train_step, run, engine, ga, "step 2")
    after = gathered(model, names, run.stage)
    run.out["global_steps"] = int(engine.global_steps)
    run.out["params_changed"] = {n: bool(not torch.equal(before[n], after[n])) for n in names}


def gather_all(run: Run, model) -> dict:
    """Every full parameter, on rank 0 (the reference the saved file is compared with)."""
    import deepspeed

    params = dict(model.named_parameters())
    snap = {}
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None, enabled=run.stage == 3):
        if run.w.rank == 0:
            snap = {n: p.detach().cpu().clone() for n, p in params.items()}
    return snap


def save_16bit(run: Run, engine, save_dir: str) -> dict:
    saved = engine.save_16bit_model(save_dir)
    info = {"saved": bool(saved)}
    if not saved and run.w.rank == 0:
        # what save_pretrained / a plain state_dict would write instead: the local partitions
        sd = engine.module.state_dict()
        info["state_dict_empty"] = sorted(k for k, v in sd.items() if v.numel() == 0)
        info["state_dict_tensors"] = len(sd)
    return info


def reload_compare(run: Run, save_dir: str, snapshot: dict) -> dict:
    """On rank 0: the saved file against the gathered weights, then loaded into the baseline model."""
    import torch

    path = os.path.join(save_dir, "pytorch_model.bin")
    rep = {"path_exists": os.path.exists(path)}
    if run.w.rank != 0 or not rep["path_exists"]:
        return rep
    sd = torch.load(path, map_location="cpu", weights_only=True)
    rep["saved_tensors"] = len(sd)
    rep["saved_bytes"] = os.path.getsize(path)
    rep.update(compare_saved(sd, snapshot))
    if run.plain is not None:
        rep.update(load_into_fresh(run.plain, sd, snapshot))
    return rep


def compare_saved(sd: dict, snapshot: dict) -> dict:
    """Saved tensors that are empty, missing, or differ from the gathered ones."""
    import torch

    rep = {"empty": sorted(k for k, v in sd.items() if v.numel() == 0 and snapshot.get(k, v).numel() > 0),
           "missing": sorted(n for n in snapshot if n not in sd)}
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
    return rep


def load_into_fresh(plain, sd: dict, snapshot: dict) -> dict:
    """The saved weights into a fresh copy of the architecture, as from_pretrained would."""
    import torch

    res = plain.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()}, strict=False)
    # a key missing from the file is fine when its tensor is tied to one that was loaded
    fresh_sd = plain.state_dict(keep_vars=True)
    loaded_ptrs = {fresh_sd[k].data_ptr() for k in sd if k in fresh_sd}
    named = dict(plain.named_parameters(remove_duplicate=False))
    rep = {"fresh_missing": sorted(k for k in res.missing_keys
                                   if k in fresh_sd and fresh_sd[k].data_ptr() not in loaded_ptrs and k in named),
           "fresh_unexpected": sorted(res.unexpected_keys)}
    fresh = dict(plain.named_parameters())
    rep["fresh_differ"] = sorted(n for n, ref in snapshot.items()
                                 if n in fresh and not torch.equal(fresh[n].detach(), ref.float()))[:20]
    return rep


def save_reload(run: Run, model, engine) -> None:
    snapshot = run.step("gather", gather_all, run, model)
    save_dir = os.path.join(run.a["scratch"], "save16")
    run.out["save"] = run.step("save_16bit", save_16bit, run, engine, save_dir)
    run.out["reload"] = run.step("reload_compare", reload_compare, run, save_dir, snapshot)


def moe_cover(run: Run, blocks) -> dict:
    """Which of the model's MoE block classes LLaMA-Factory and the DeepSpeed config make leaf modules."""
    block_classes = sorted({type(b).__name__ for _, b in blocks})
    ds_leaf = (run.ds_config.get("zero_optimization") or {}).get("leaf_module")
    ds_classes = DEEPSPEED_DEFAULT_LEAF if ds_leaf is None else tuple(
        str(c).rsplit(".", 1)[-1] for c in ((ds_leaf or {}).get("classes") or []))
    return {"blocks": block_classes,
            "by_llamafactory": [c for c in block_classes if c in run.lf_leaf],
            "by_deepspeed_config": [c for c in block_classes if c in ds_classes]}


def with_leaf_modules(run: Run) -> None:
    """Run A: the user's run; MoE blocks as ZeRO-3 leaf modules (LLaMA-Factory's and the detected ones)."""
    import torch
    import torch.distributed as dist

    out = run.out
    leaf = list(dict.fromkeys(run.lf_leaf + out.get("moe_block_classes", []))) if run.moe else run.lf_leaf
    model, info, blocks = run.step("zero_init", zero_init, run, run.ds_config, leaf)
    out["build"] = info
    if run.moe:
        out["moe_cover"] = moe_cover(run, blocks)
    used = set()
    hooks = force_routing(blocks, run.n_experts, run.w.rank, torch, used) if run.moe else []
    out["routing_forced"] = len(hooks)
    engine, out["optimizer"] = run.step("deepspeed_initialize", make_engine, run, model, run.ds_config)
    steps(run, model, engine)
    save_reload(run, model, engine)
    dist.barrier()
    for h in hooks:
        h.remove()
    out["experts_used"] = sorted(used)


# ---- run B: the same MoE model without any ZeRO-3 leaf module, routing forced apart -----------------

def no_leaf_check(run: Run) -> None:
    """Run B, under an inner time limit: a hang is the finding, so the result is written first,
    and again by a timer that ends the rank if the limit passes."""
    run.hf_ds = None  # free run A before run B
    gc.collect()
    cfg_b = copy.deepcopy(run.ds_config)
    cfg_b["zero_optimization"]["leaf_module"] = {"classes": [], "names": [], "name_suffixes": []}
    # a few times what the same work took with leaf modules, within the probe's cap
    took_a = sum(run.out["steps"].get(k, 0) for k in ("zero_init", "deepspeed_initialize", "step_1", "step_2_accumulation"))
    limit = min(float(run.a.get("moe_limit_s", 45)), max(10.0, 4 * took_a))
    no_leaf = run.out["no_leaf"] = {"started": True, "finished": False, "limit_s": round(limit, 1)}
    run.write(ok=True)  # A's result stands even if B hangs or crashes and this rank is killed
    t_b = time.perf_counter()
    timer = threading.Timer(limit, no_leaf_timed_out, (run, t_b))
    timer.daemon = True
    timer.start()
    try:
        no_leaf_steps(run, cfg_b)
    except StepFailed as exc:
        timer.cancel()
        no_leaf.update({"finished": True, "error": failure(exc.step, exc.exc)})
        run.write(ok=True)
        leave(0)  # no barrier: the other rank may sit in a collective that never completes
    timer.cancel()
    no_leaf.update({"finished": True, "hung": False, "after_s": round(time.perf_counter() - t_b, 1)})


def no_leaf_steps(run: Run, cfg_b: dict) -> None:
    import torch
    import torch.distributed as dist

    no_leaf = run.out["no_leaf"]
    model_b, no_leaf["build"], blocks_b = run.step("no_leaf_zero_init", zero_init, run, cfg_b, [])
    used_b = set()
    force_routing(blocks_b, run.n_experts, run.w.rank, torch, used_b)
    engine_b, _ = run.step("no_leaf_deepspeed_initialize", make_engine, run, model_b, cfg_b)
    no_leaf["losses"] = run.step("no_leaf_steps", train_step, run, engine_b, 2, "no-leaf steps")
    no_leaf["experts_used"] = sorted(used_b)
    run.w.phase("no_leaf_barrier")
    dist.barrier()


def no_leaf_timed_out(run: Run, t_b: float) -> None:
    w = run.w
    run.out["no_leaf"].update({"hung": True, "phase": w.phases[-1][0] if w.phases else None,
                               "after_s": round(time.perf_counter() - t_b, 1)})
    run.write(ok=True)
    leave(0)


def body(run: Run) -> None:
    prepare(run)
    with_leaf_modules(run)
    if run.moe and run.a.get("moe_check") and run.stage == 3:
        no_leaf_check(run)


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
