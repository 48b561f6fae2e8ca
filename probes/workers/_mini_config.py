"""The rehearsal's YAML and DeepSpeed JSON: the user's own, with only what a miniature must
change. Kept: stage, finetuning type, template, LoRA settings and targets, packing, the
DeepSpeed config's stage/offload/sections, gradient accumulation, the optimizer and scheduler
settings, precision where the hardware has it. Changed: the model, the dataset folder, the
output folder (all in the rehearsal's temporary folder), a few steps with a save, a short
cutoff. Dropped: what points at the user's files or at the world outside (adapters and
checkpoints of the full-size model, hub uploads, loggers, evaluation). Every change is a note.

Plain Python on dicts: the rehearse worker uses it, the tests call it directly."""

from __future__ import annotations

import copy

MAX_STEPS = 3
CUTOFF_CAP = 128
BATCH_CAP = 2
ACCUMULATION_CAP = 8
SAMPLES = 16
DDP_TIMEOUT_CAP = 600
# keys that name the user's files or the full-size model's artefacts: they cannot serve a shrunk copy
DROPPED = {
    "adapter_name_or_path": "an adapter trained on the full-size model does not fit the shrunk copy",
    "resume_from_checkpoint": "a checkpoint of the full-size run does not fit the shrunk copy",
    "ref_model": "the reference model is not shrunk: LLaMA-Factory uses the policy model itself",
    "ref_model_adapters": "belongs to ref_model",
    "reward_model": "the reward model is not shrunk",
    "logging_dir": "logs go to the rehearsal's own output folder",
    "cache_dir": "downloads and caches go to the rehearsal's own folder",
    "hub_model_id": "the rehearsal never uploads",
    "eval_dataset": "the rehearsal does not evaluate",
    "val_size": "the rehearsal does not evaluate",
    "media_dir": "synthetic and copied samples carry no media",
    "ray_num_workers": "Ray launches are not rehearsed: the rehearsal starts torchrun itself",
    "ray_run_name": "Ray launches are not rehearsed",
    "ray_storage_path": "Ray launches are not rehearsed",
    "run_name": "the rehearsal names its own run",
}
FORCED_OFF = ("push_to_hub", "do_eval", "do_predict", "predict_with_generate", "load_best_model_at_end")
WORKER_KEYS = (("preprocessing_num_workers", 1), ("dataloader_num_workers", 0))


def mini_yaml(user: dict, *, model_dir: str, data_dir: str | None, out_dir: str, ds: dict | None,
              ds_path: str | None, on_gpu: bool, bf16_ok: bool, quantization_ok: bool) -> tuple[dict, list[str]]:
    """The YAML the rehearsal runs, and the notes that say what differs from the user's."""
    y = copy.deepcopy(user)
    notes: list[str] = []
    y["model_name_or_path"] = model_dir
    if data_dir is not None:
        y["dataset_dir"] = data_dir
    y["output_dir"] = f"{out_dir}/out"
    y["overwrite_output_dir"] = True
    if y.get("tokenized_path"):
        y["tokenized_path"] = f"{out_dir}/tokenized"
        notes.append("tokenized_path: the rehearsal tokenizes its own samples into its own folder")
    _steps(y, notes)
    _batch(y, ds, notes)
    _cutoff(y, notes)
    _drop(y, notes)
    _precision(y, ds_path is not None, on_gpu, bf16_ok, notes)
    _quantization(y, quantization_ok, notes)
    if ds_path is not None:
        y["deepspeed"] = ds_path
    return y, notes


def _steps(y: dict, notes: list[str]) -> None:
    """A few optimizer steps, a logged loss at each, a checkpoint at the last, nothing reported outside."""
    y["max_steps"] = MAX_STEPS
    y["save_strategy"] = "steps"
    y["save_steps"] = MAX_STEPS
    y["logging_steps"] = 1
    y["report_to"] = "none"
    y["overwrite_cache"] = True
    y["max_samples"] = SAMPLES
    y.pop("save_total_limit", None)
    if y.get("eval_strategy") not in (None, "no") or y.get("evaluation_strategy") not in (None, "no"):
        notes.append("evaluation turned off (the rehearsal trains and saves)")
    y["eval_strategy"] = "no"
    y.pop("evaluation_strategy", None)
    for key in FORCED_OFF:
        if y.get(key):
            notes.append(f"{key}: off in the rehearsal")
        y.pop(key, None)
    for key, value in WORKER_KEYS:
        if isinstance(y.get(key), int) and y[key] > value:
            notes.append(f"{key}: {y[key]} -> {value} ({SAMPLES} samples)")
            y[key] = value
    timeout = y.get("ddp_timeout")
    if not isinstance(timeout, (int, float)) or timeout > DDP_TIMEOUT_CAP:
        y["ddp_timeout"] = DDP_TIMEOUT_CAP


DS_BATCH_KEYS = {"per_device_train_batch_size": "train_micro_batch_size_per_gpu",
                 "gradient_accumulation_steps": "gradient_accumulation_steps"}


def _batch(y: dict, ds: dict | None, notes: list[str]) -> None:
    """A small micro-batch and the user's accumulation, capped (3 steps of it must stay short),
    unless the DeepSpeed config states the batch in numbers: then the HF Trainer checks the YAML
    against them, and a cap would make a mismatch the user's run does not have."""
    fixed = [k for k in ("train_batch_size", *DS_BATCH_KEYS.values()) if isinstance((ds or {}).get(k), int)]
    for key, cap in (("per_device_train_batch_size", BATCH_CAP), ("gradient_accumulation_steps", ACCUMULATION_CAP)):
        value = y.get(key)
        if not (isinstance(value, int) and value > cap):
            continue
        if fixed:
            notes.append(f"{key}: {value} kept (the DeepSpeed config sets {', '.join(fixed)} in numbers)")
            continue
        notes.append(f"{key}: {value} -> {cap}" + (" (the DeepSpeed config's \"auto\" follows it)" if ds else ""))
        y[key] = cap


def _cutoff(y: dict, notes: list[str]) -> None:
    cutoff = y.get("cutoff_len", 2048)
    if not isinstance(cutoff, int) or cutoff > CUTOFF_CAP:
        y["cutoff_len"] = CUTOFF_CAP
        notes.append(f"cutoff_len: {cutoff} -> {CUTOFF_CAP}" + (" (packing kept)" if y.get("packing") else ""))


def _drop(y: dict, notes: list[str]) -> None:
    for key, why in DROPPED.items():
        if y.get(key) not in (None, "", False):
            notes.append(f"{key} dropped: {why}")
        y.pop(key, None)


def _precision(y: dict, deepspeed: bool, on_gpu: bool, bf16_ok: bool, notes: list[str]) -> None:
    """Precision as asked where the hardware has it. On the CPU, transformers refuses bf16 unless
    use_cpu is set, and use_cpu turns DeepSpeed off: with DeepSpeed the CPU rehearsal runs fp32;
    without it, bf16 runs with use_cpu where the CPU has bf16. fp16 needs a GPU."""
    if on_gpu:
        return
    if y.get("fp16"):
        y["fp16"] = False
        notes.append("fp16 dropped on the CPU (fp16 mixed precision needs a GPU): fp32; the GPU run uses fp16")
    if y.get("bf16"):
        if deepspeed or not bf16_ok:
            y["bf16"] = False
            why = ("transformers refuses bf16 without a GPU unless use_cpu is set, which turns DeepSpeed off"
                   if deepspeed else "this CPU has no native bf16")
            notes.append(f"bf16 dropped on the CPU ({why}): fp32; the GPU run uses bf16")
        else:
            y["use_cpu"] = True
            notes.append("bf16 kept on the CPU with use_cpu: true (transformers' condition for bf16 without a GPU)")
    if y.get("pure_bf16") and (deepspeed or not bf16_ok):
        y["pure_bf16"] = False
        notes.append("pure_bf16 dropped on the CPU: fp32")


def _quantization(y: dict, quantization_ok: bool, notes: list[str]) -> None:
    if y.get("quantization_bit") is None or quantization_ok:
        return
    method = y.get("quantization_method", "bnb")
    notes.append(f"quantization_bit {y['quantization_bit']} ({method}) dropped: its backend cannot run here "
                 "(a GPU and the package are needed); the rehearsal trains the shrunk model unquantized")
    for key in ("quantization_bit", "quantization_method", "quantization_type", "double_quantization",
                "quantization_device_map"):
        y.pop(key, None)


def mini_ds_config(ds: dict, *, yaml: dict, on_gpu: bool, scratch_dir: str) -> tuple[dict, list[str]]:
    """The user's DeepSpeed JSON for the rehearsal: the same sections, with NVMe swap files in the
    rehearsal's folder, the monitors off, and on the CPU what only a GPU has turned off (an
    explicit bf16/fp16 section follows the YAML's precision, fused optimizers give way to the
    HF Trainer's AdamW, pinned memory off)."""
    cfg = copy.deepcopy(ds)
    notes: list[str] = []
    zero = cfg.get("zero_optimization") if isinstance(cfg.get("zero_optimization"), dict) else {}
    for which in ("offload_optimizer", "offload_param"):
        sec = zero.get(which)
        if isinstance(sec, dict) and str(sec.get("device", "")).lower() == "nvme":
            sec["nvme_path"] = f"{scratch_dir}/nvme"
            notes.append(f"{which}: NVMe swap files in the rehearsal's folder")
        if isinstance(sec, dict) and not on_gpu and sec.get("pin_memory"):
            sec["pin_memory"] = False
    for key in ("tensorboard", "wandb", "csv_monitor", "comet", "aim", "flops_profiler", "comms_logger"):
        if cfg.pop(key, None) is not None:
            notes.append(f"DeepSpeed {key} section dropped (it writes outside the rehearsal's folder)")
    if not on_gpu:
        _cpu_precision(cfg, yaml, notes)
        opt = cfg.get("optimizer")
        if isinstance(opt, dict) and not (isinstance(zero.get("offload_optimizer"), dict)
                                          and str(zero["offload_optimizer"].get("device", "")).lower() == "cpu"):
            cfg.pop("optimizer")
            cfg["zero_allow_untested_optimizer"] = True
            notes.append(f"DeepSpeed optimizer {opt.get('type')} (a CUDA kernel) replaced on the CPU by the HF "
                         "Trainer's AdamW")
    return cfg, notes


def _cpu_precision(cfg: dict, yaml: dict, notes: list[str]) -> None:
    for key in ("bf16", "fp16"):
        sec = cfg.get(key)
        if isinstance(sec, dict) and sec.get("enabled") is True and not yaml.get(key):
            sec["enabled"] = False
            notes.append(f"DeepSpeed {key}.enabled: true -> false on the CPU (with the YAML's precision)")
