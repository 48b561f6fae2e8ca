"""The user's run as the doctor reads it: a LLaMA-Factory train YAML (and the DeepSpeed JSON it
names), or a DeepSpeed JSON alone. Reading never changes the user's files; a file that cannot
be read or parsed is one clear line (exit code 2)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..errors import InputError
from .reading import (DS_EXPECT, MAX_YAML_VALUES, YAML_EXPECT, check_expected, check_tree, describe, parse_json,
                      parse_yaml, path_is_file, read_text, why_not_file)


@dataclass
class RunConfig:
    yaml_path: str | None = None
    yaml: dict = field(default_factory=dict)
    ds_path: str | None = None  # as resolved on disk
    ds_ref: str | None = None  # as written in the YAML
    ds: dict | None = None
    ds_error: str | None = None  # the YAML names a DeepSpeed config that cannot be used
    model: str | None = None
    yaml_text: str | None = None  # the files' text as read (fix diffs and rewrites exactly this)
    ds_text: str | None = None
    ds_from_cwd: bool = False  # ds_path is the file LLaMA-Factory opens when started from here
    ds_base: str | None = None  # else the folder (the YAML's or a parent) it was found relative to
    ds_inline: bool = False  # the YAML's `deepspeed:` is the DeepSpeed config itself
    for_initialize: bool = False  # fix --no-trainer: the JSON goes to deepspeed.initialize, no Trainer fills "auto"

    @property
    def zero(self) -> dict:
        z = (self.ds or {}).get("zero_optimization") or {}
        return z if isinstance(z, dict) else {}

    @property
    def zero_stage(self) -> int | None:
        stage = self.zero.get("stage") if self.ds is not None else None
        if stage is None and self.ds is not None:
            return 0
        try:
            return int(stage)
        except (TypeError, ValueError, OverflowError):
            return None

    def offload_device(self, which: str) -> str | None:
        """'cpu', 'nvme' or None for which in ('offload_optimizer', 'offload_param')."""
        o = self.zero.get(which)
        if isinstance(o, dict):
            dev = str(o.get("device", "none")).lower()
            return None if dev in ("none", "") else dev
        return None

    @property
    def offload(self) -> set[str]:
        return {d for d in (self.offload_device("offload_optimizer"), self.offload_device("offload_param")) if d}

    def get(self, key: str, default=None):
        return self.yaml.get(key, default)

    @cached_property
    def model_config(self) -> tuple[dict | None, str]:
        """The model's config.json (never the weights) and where it came from, or None and why not;
        read once per check, though several probes ask (applies() and run() alike)."""
        from .model_config import load_model_config

        if not self.model:
            return None, "no model given"
        return load_model_config(self.model)

    def deepspeed_ops(self, gpu: bool) -> list[tuple[str, str]]:
        """The DeepSpeed ops this run JIT-builds on this machine, each once with the reason, as
        DeepSpeed and the HF Trainer/accelerate choose them (deepspeed/runtime/engine.py
        _configure_basic_optimizer and get_optimizer_configuration; transformers'
        deepspeed_optim_sched; accelerate's map_pytorch_optim_to_deepspeed): deepspeed.install checks
        their toolchain, deepspeed.ops builds them. Without a run config: the machine-level set."""
        if self.ds is None:
            if self.yaml_path:
                return []  # a run without DeepSpeed builds no DeepSpeed op
            if not gpu:
                return [("cpu_adam", "DeepSpeed's Adam on the CPU accelerator (no GPU: DS_ACCELERATOR=cpu)")]
            return [("fused_adam", "runs whose DeepSpeed JSON names an Adam optimizer (no offload) build it; proves the CUDA toolchain"),
                    ("cpu_adam", "runs that offload the optimizer to the CPU build it")]
        ops: list[tuple[str, str]] = []
        opt = self.ds.get("optimizer")
        opt = opt if isinstance(opt, dict) else None
        kind = str((opt or {}).get("type", "")).lower()
        params = (opt or {}).get("params")
        torch_adam = isinstance(params, dict) and params.get("torch_adam") is True
        offloaded = self.offload_device("offload_optimizer") in ("cpu", "nvme")
        if opt is not None and kind in ("adam", "adamw") and not torch_adam:
            if offloaded:
                ops.append(("cpu_adam", f"the DeepSpeed JSON's {opt.get('type')} optimizer with offload_optimizer to "
                            f"{self.offload_device('offload_optimizer')}: DeepSpeedCPUAdam"))
            elif gpu:
                ops.append(("fused_adam", f"the DeepSpeed JSON's {opt.get('type')} optimizer on GPUs: FusedAdam"))
            else:
                ops.append(("cpu_adam", f"the DeepSpeed JSON's {opt.get('type')} optimizer on the CPU accelerator"))
        elif opt is None and offloaded and self.ds.get("zero_force_ds_cpu_optimizer", True) is not False:
            ops.append(("cpu_adam", "no optimizer in the DeepSpeed JSON and offload_optimizer on: accelerate swaps the "
                        "Trainer's torch optimizer for DeepSpeedCPUAdam"))
        if "nvme" in self.offload:
            ops.append(("async_io", "offload to NVMe: DeepSpeed swaps tensors through libaio"))
        return ops

    @property
    def gradient_accumulation(self) -> int | None:
        for value in (self.yaml.get("gradient_accumulation_steps"), (self.ds or {}).get("gradient_accumulation_steps")):
            if isinstance(value, int):
                return value
        return None


def read_yaml(path: str) -> dict:
    return yaml_mapping(read_text(path, "LLaMA-Factory YAML"), path)


def yaml_mapping(text: str, path: str) -> dict:
    """A LLaMA-Factory train YAML: a mapping whose known keys hold what LLaMA-Factory types them as."""
    data = parse_yaml(text, path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: a LLaMA-Factory config must be a mapping of keys, got {describe(data)}")
    check_tree(data, path, limit=MAX_YAML_VALUES)
    check_expected(data, YAML_EXPECT, path)
    return data


def read_ds_json(path: str) -> dict:
    return check_ds(parse_json(read_text(path, "DeepSpeed JSON"), path), path)


def check_ds(data, path: str, prefix: str = "") -> dict:
    """A DeepSpeed config (a file's, or inline under `deepspeed:` with prefix "deepspeed.") whose
    sections are mappings and whose batch sizes are numbers or "auto"."""
    if not isinstance(data, dict):
        where = f"{prefix.rstrip('.')}: " if prefix else ""
        raise InputError(f"{path}: {where}a DeepSpeed config must be a JSON object, got {describe(data)}")
    check_tree(data, path, tuple(prefix.rstrip(".").split(".")) if prefix else ())
    check_expected(data, DS_EXPECT, path, prefix)
    return data


def resolve_ds_path(ref: str, yaml_path: str | None) -> tuple[str | None, str | None]:
    """(the file, the folder it was found relative to; None: as written, the file LLaMA-Factory
    opens when started here). LLaMA-Factory hands `deepspeed:` as a plain string to transformers,
    which opens it relative to the current directory: that file, when it exists, is the run's.
    Otherwise the YAML's folder (a bare name) or its parents (a path with folders: the
    LLaMA-Factory checkout the YAML sits in, `examples/deepspeed/...`), never a same-named file
    elsewhere."""
    if path_is_file(ref):
        return ref, None
    if yaml_path and not os.path.isabs(ref):
        folders = Path(os.path.abspath(yaml_path)).parents
        for folder in folders if os.sep in ref else folders[:1]:
            if path_is_file(str(folder / ref)):
                return str(folder / ref), str(folder)
    return None, None


def load_run_config(config: str | None, deepspeed: str | None = None, model: str | None = None) -> RunConfig:
    rc = RunConfig(model=model)
    if config:
        if config.lower().endswith(".json"):
            _load_ds_file(rc, config)
        else:
            _load_yaml(rc, config, use_its_deepspeed=not deepspeed)
    if deepspeed:
        _load_ds_file(rc, deepspeed)
    return rc


def _load_ds_file(rc: RunConfig, path: str, from_cwd: bool = True) -> None:
    rc.ds_path, rc.ds_from_cwd = path, from_cwd
    rc.ds_text = read_text(path, "DeepSpeed JSON")
    rc.ds = check_ds(parse_json(rc.ds_text, path), path)


def _load_yaml(rc: RunConfig, path: str, use_its_deepspeed: bool) -> None:
    """The YAML, and the DeepSpeed config it names (a file, or a mapping inline); a named config
    that cannot be used is rc.ds_error, which config.deepspeed reports."""
    rc.yaml_path = path
    rc.yaml_text = read_text(path, "LLaMA-Factory YAML")
    rc.yaml = yaml_mapping(rc.yaml_text, path)
    rc.model = rc.model or rc.yaml.get("model_name_or_path")
    ref = rc.yaml.get("deepspeed")
    if not ref or not use_its_deepspeed:
        return
    if isinstance(ref, dict):  # TrainingArguments takes the DeepSpeed config itself as well
        rc.ds_inline, rc.ds_path = True, f"{path} (inline deepspeed:)"
        try:
            rc.ds = check_ds(ref, path, "deepspeed.")
        except InputError as exc:
            rc.ds_error = str(exc)
        return
    rc.ds_ref = ref
    found, rc.ds_base = resolve_ds_path(ref, path)
    if found is None:
        rc.ds_error = f"the DeepSpeed config {_clip(ref)} named in {path} {why_not_file(ref)}"
        return
    try:
        _load_ds_file(rc, found, from_cwd=rc.ds_base is None)
    except InputError as exc:
        rc.ds_path, rc.ds, rc.ds_text = found, None, None
        rc.ds_error = str(exc)


def _clip(ref: str, limit: int = 120) -> str:
    text = repr(ref)
    return text if len(text) <= limit else text[: limit - 2] + "…'"
