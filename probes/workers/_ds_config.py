"""Filling a DeepSpeed config the way the HF Trainer would ("auto" values from the training
arguments), for the tiny zero3.model run. Plain Python on dicts: the zero3_model worker uses
it on the rank side, and the tests use it directly."""

from __future__ import annotations

import copy

DEFAULT_ZERO3 = {  # LLaMA-Factory's examples/deepspeed/ds_z3_config.json (v0.9.5)
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_allow_untested_optimizer": True,
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 3, "overlap_comm": False, "contiguous_gradients": True, "sub_group_size": 1e9,
        "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True,
    },
}
MAX_ACCUMULATION = 4
MONITOR_KEYS = ("tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger", "aim")


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _auto(v) -> bool:
    return isinstance(v, str) and v.strip().lower() == "auto"


def _truthy(v) -> bool:
    """A flag as DeepSpeed's JSON and the HF Trainer hold it (true, or the string "true")."""
    return v is True or (isinstance(v, str) and v.strip().lower() == "true")


def fill_ds_config(ds: dict | None, *, yaml: dict | None, world_size: int, hidden_size: int, on_gpu: bool,
                   bf16_ok: bool, scratch_dir: str) -> tuple[dict, dict, list[str]]:
    """(config to run, facts about it, notes). `facts` has: stage, accumulation, precision,
    optimizer ('config' = the config's own, 'torch-adamw' = client torch.optim.AdamW,
    'ds-cpu-adam' = DeepSpeedCPUAdam as accelerate maps it under offload), offload."""
    yaml = yaml or {}
    notes: list[str] = []
    cfg = copy.deepcopy(ds) if ds else copy.deepcopy(DEFAULT_ZERO3)
    if not ds:
        notes.append("no DeepSpeed config given: LLaMA-Factory's ds_z3_config.json (ZeRO-3, 16-bit gather on save)")
    zero = _zero_section(cfg)
    run_ga, ga = _fill_batch(cfg, yaml, world_size, notes)
    precision = _fill_precision(cfg, yaml, on_gpu, bf16_ok, notes)
    _fill_buckets(zero, hidden_size, notes)
    offload = _fill_offload(zero, ds, on_gpu, scratch_dir, notes)
    lr, optimizer = _fill_optimizer(cfg, yaml, on_gpu, offload, notes)
    _drop_unused_sections(cfg, notes)
    facts = {"stage": zero["stage"], "accumulation": run_ga, "accumulation_asked": ga, "precision": precision,
             "optimizer": optimizer, "offload": offload, "lr": lr,
             "gather_on_save": _truthy(zero.get("stage3_gather_16bit_weights_on_model_save",
                                                zero.get("gather_16bit_weights_on_model_save", False)))}
    return cfg, facts, notes


def _zero_section(cfg: dict) -> dict:
    """zero_optimization with an integer stage ("auto" is 3, as LLaMA-Factory's configs mean it)."""
    zero = cfg.get("zero_optimization")
    if not isinstance(zero, dict):
        zero = cfg["zero_optimization"] = {"stage": 0}
    stage = _int(zero.get("stage")) if not _auto(zero.get("stage")) else 3
    zero["stage"] = stage if stage is not None else 0
    return zero


def _fill_batch(cfg: dict, yaml: dict, world_size: int, notes: list[str]) -> tuple[int, int]:
    """Micro-batch 1, the YAML's accumulation (capped), the batch that follows; gradient clipping.
    Returns (accumulation run, accumulation asked)."""
    micro = 1
    ga = _int(yaml.get("gradient_accumulation_steps")) or _int(cfg.get("gradient_accumulation_steps")) or 1
    run_ga = min(ga, MAX_ACCUMULATION)
    if run_ga != ga:
        notes.append(f"gradient accumulation {ga} run as {run_ga} (enough to cross an accumulation boundary)")
    cfg["train_micro_batch_size_per_gpu"] = micro
    cfg["gradient_accumulation_steps"] = run_ga
    cfg["train_batch_size"] = micro * run_ga * world_size
    if _auto(cfg.get("gradient_clipping")):
        cfg["gradient_clipping"] = float(yaml.get("max_grad_norm", 1.0))
    return run_ga, ga


def _fill_precision(cfg: dict, yaml: dict, on_gpu: bool, bf16_ok: bool, notes: list[str]) -> str:
    """An "auto" precision follows the YAML (bf16/fp16 keys), as the HF Trainer does; what the
    hardware here cannot run falls back to fp32. Returns bf16, fp16 or fp32."""
    want = {}
    for key in ("fp16", "bf16"):
        sec = cfg.get(key)
        if isinstance(sec, dict):
            en = sec.get("enabled")
            want[key] = _truthy(yaml.get(key)) if _auto(en) else _truthy(en)
    if not on_gpu:
        keep_bf16 = bool(want.get("bf16")) and bf16_ok  # a CPU with native bf16 (avx512_bf16 / AMX)
        for key in ("fp16", "bf16"):
            if want.get(key) and not (key == "bf16" and keep_bf16):
                notes.append(f"{key} requested: run in fp32 on CPU (gloo)"
                             + ("; this CPU has no native bf16" if key == "bf16" else "") + f"; the GPU run uses {key}")
            if isinstance(cfg.get(key), dict):
                cfg[key]["enabled"] = key == "bf16" and keep_bf16
        return "bf16" if keep_bf16 else "fp32"
    if want.get("bf16") and not bf16_ok:
        notes.append("bf16 requested but this GPU has no bf16: run in fp32")
        want["bf16"] = False
    for key in ("fp16", "bf16"):
        if isinstance(cfg.get(key), dict):
            cfg[key]["enabled"] = bool(want.get(key))
    return "bf16" if want.get("bf16") else "fp16" if want.get("fp16") else "fp32"


def _fill_buckets(zero: dict, hidden_size: int, notes: list[str]) -> None:
    """The bucket sizes the HF Trainer derives from the hidden size; other "auto" values dropped."""
    if zero["stage"] in (1, 2, 3):
        h2 = hidden_size * hidden_size
        for k, v in (("reduce_bucket_size", h2), ("stage3_prefetch_bucket_size", int(0.9 * h2)),
                     ("stage3_param_persistence_threshold", 10 * hidden_size)):
            if _auto(zero.get(k)):
                zero[k] = v
    for k, v in list(zero.items()):
        if _auto(v):
            zero.pop(k)
            notes.append(f"zero_optimization.{k}: 'auto' that the HF Trainer leaves alone: dropped")


def _fill_offload(zero: dict, ds: dict | None, on_gpu: bool, scratch_dir: str, notes: list[str]) -> dict:
    """{which: device} of the offloads; NVMe swap files go to the probe's folder, never the user's."""
    offload = {}
    for which in ("offload_optimizer", "offload_param"):
        sec = zero.get(which)
        if isinstance(sec, dict) and str(sec.get("device", "none")).lower() not in ("none", ""):
            offload[which] = str(sec["device"]).lower()
            if offload[which] == "nvme":
                sec["nvme_path"] = f"{scratch_dir}/nvme"
                notes.append(f"{which}: NVMe swap files go to the probe's own folder, not {ds and (ds.get('zero_optimization') or {}).get(which, {}).get('nvme_path')}")
            if not on_gpu:
                sec["pin_memory"] = False
    return offload


def _fill_optimizer(cfg: dict, yaml: dict, on_gpu: bool, offload: dict, notes: list[str]) -> tuple[float, str]:
    """The optimizer's "auto" values from the YAML, and which optimizer runs:
    'config', 'torch-adamw' or 'ds-cpu-adam'. Returns (learning rate, optimizer)."""
    lr = float(yaml.get("learning_rate", 5e-5))
    opt = cfg.get("optimizer")
    if isinstance(opt, dict):
        params = opt.setdefault("params", {})
        fills = {"lr": lr, "betas": [float(yaml.get("adam_beta1", 0.9)), float(yaml.get("adam_beta2", 0.999))],
                 "eps": float(yaml.get("adam_epsilon", 1e-8)), "weight_decay": float(yaml.get("weight_decay", 0.0))}
        for k, v in fills.items():
            if _auto(params.get(k)):
                params[k] = v
        if not on_gpu and not offload.get("offload_optimizer"):
            notes.append(f"optimizer {opt.get('type')} (fused, CUDA only) replaced on CPU by torch.optim.AdamW")
            cfg.pop("optimizer")
            optimizer = "torch-adamw"
        else:
            optimizer = "config"
    else:
        optimizer = "ds-cpu-adam" if offload.get("offload_optimizer") else "torch-adamw"
    if optimizer != "config":
        cfg["zero_allow_untested_optimizer"] = True
    return lr, optimizer


def _drop_unused_sections(cfg: dict, notes: list[str]) -> None:
    """The scheduler and the monitors (they would write outside the probe's folder); no prints."""
    if "scheduler" in cfg:
        cfg.pop("scheduler")
        notes.append("scheduler section not used (a learning-rate schedule does not change what ZeRO-3 does)")
    for k in MONITOR_KEYS:
        if k in cfg:
            cfg.pop(k)
            notes.append(f"{k} section dropped (the probe writes nothing outside its temporary folder)")
    cfg["steps_per_print"] = 10 ** 9
    cfg["wall_clock_breakdown"] = False
