"""The user's run as the doctor reads it: a LLaMA-Factory train YAML (and the DeepSpeed JSON it
names), or a DeepSpeed JSON alone. Reading never changes the user's files; a file that cannot
be read or parsed is one clear line (exit code 2)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

from ..errors import InputError


@dataclass
class RunConfig:
    yaml_path: str | None = None
    yaml: dict = field(default_factory=dict)
    ds_path: str | None = None  # as resolved on disk
    ds_ref: str | None = None  # as written in the YAML
    ds: dict | None = None
    ds_error: str | None = None  # the YAML names a DeepSpeed config that cannot be used
    model: str | None = None

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
        except (TypeError, ValueError):
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
        """The DeepSpeed ops this run builds on this machine (GPUs, or the CPU accelerator without
        them), each once with the reason: deepspeed.install checks their toolchain, deepspeed.ops
        builds them."""
        ops = [("fused_adam", "DeepSpeed's Adam on GPUs (an optimizer in the DeepSpeed config); proves the CUDA toolchain")
               if gpu else ("cpu_adam", "DeepSpeed's Adam on the CPU accelerator (no GPU: DS_ACCELERATOR=cpu)")]
        opt_dev = self.offload_device("offload_optimizer")
        if gpu and opt_dev in ("cpu", "nvme"):
            ops.append(("cpu_adam", f"offload_optimizer to {opt_dev}: the optimizer steps on the CPU with DeepSpeedCPUAdam"))
        if "nvme" in self.offload:
            ops.append(("async_io", "offload to NVMe: DeepSpeed swaps tensors through libaio"))
        return ops

    @property
    def gradient_accumulation(self) -> int | None:
        for value in (self.yaml.get("gradient_accumulation_steps"), (self.ds or {}).get("gradient_accumulation_steps")):
            if isinstance(value, int):
                return value
        return None


def _read_text(path: str, what: str) -> str:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file ({what})")
    if p.is_dir():
        raise InputError(f"{path}: is a directory, not a {what}")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})")
    if b"\x00" in data[:4096]:
        raise InputError(f"{path}: looks like binary data, not a {what}")
    return data.decode("utf-8", "replace")


def read_yaml(path: str) -> dict:
    text = _read_text(path, "LLaMA-Factory YAML")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise InputError(f"{path}: not valid YAML ({where}{getattr(exc, 'problem', None) or exc})")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: a LLaMA-Factory config must be a mapping of keys, got {type(data).__name__}")
    return data


def read_ds_json(path: str) -> dict:
    text = _read_text(path, "DeepSpeed JSON")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})")
    except ValueError as exc:
        raise InputError(f"{path}: {exc}")
    if not isinstance(data, dict):
        raise InputError(f"{path}: a DeepSpeed config must be a JSON object")
    return data


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"duplicate key {k!r} (DeepSpeed rejects it)")
        seen[k] = v
    return seen


def resolve_ds_path(ref: str, yaml_path: str | None) -> str | None:
    """LLaMA-Factory resolves `deepspeed:` against the directory it is started from (usually its
    checkout); try that, then the YAML's folder and its parents."""
    candidates = [Path(ref)]
    if yaml_path and not os.path.isabs(ref):
        base = Path(yaml_path).resolve().parent
        for folder in [base, *base.parents]:
            candidates.append(folder / ref)
            candidates.append(folder / Path(ref).name)
    for c in candidates:
        if c.is_file():
            return str(c)
    return None


def load_run_config(config: str | None, deepspeed: str | None = None, model: str | None = None) -> RunConfig:
    rc = RunConfig(model=model)
    if config:
        if config.endswith(".json"):
            rc.ds_path = config
            rc.ds = read_ds_json(config)
        else:
            rc.yaml_path = config
            rc.yaml = read_yaml(config)
            rc.model = model or rc.yaml.get("model_name_or_path")
            ref = rc.yaml.get("deepspeed")
            if ref and not deepspeed:
                rc.ds_ref = str(ref)
                found = resolve_ds_path(str(ref), config)
                if found is None:
                    rc.ds_error = f"the DeepSpeed config {ref!r} named in {config} was not found"
                else:
                    rc.ds_path = found
                    try:
                        rc.ds = read_ds_json(found)
                    except InputError as exc:
                        rc.ds_error = str(exc)
    if deepspeed:
        rc.ds_path = deepspeed
        rc.ds = read_ds_json(deepspeed)
    return rc
