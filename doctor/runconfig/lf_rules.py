"""LLaMA-Factory 0.9.5's pre-flight, before any process starts: what its argument parser, data
loader and model loader refuse (read in its installed source; each rule names the file and
function it mirrors), and what they let through that fails later (a dataset's columns, LoRA
targets the architecture does not have, a number written as a string, an output folder that
holds a finished model). Pure functions over the YAML as LLaMA-Factory reads it, the files it
names and facts about the examined Python (Env, gathered by config.llamafactory's worker): no
import of torch or llamafactory, no run, milliseconds."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import RunConfig

SRC = "llamafactory/hparams/parser.py"
STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")
FINETUNING_TYPES = ("lora", "oft", "freeze", "full")


@dataclass
class Env:
    """What the rules know about the examined Python; None where it could not be read."""

    versions: dict[str, str] = field(default_factory=dict)  # distribution name -> version
    fields: dict[str, str] | None = None  # the train parser's argument -> its annotation
    templates: frozenset[str] | None = None
    bnb_min: str | None = None  # transformers' BITSANDBYTES_MIN_VERSION
    integrations: list[str] | None = None  # transformers' report_to names
    imports: dict[str, dict] = field(default_factory=dict)  # module -> {"ok": ..} or error fields
    devices: list[str] | None = None  # torch's devices (cpu, cuda, ...), read when a backend was imported
    cwd: str = field(default_factory=os.getcwd)  # where llamafactory-cli is assumed to start

    def has(self, dist: str) -> bool:
        return _norm(dist) in {_norm(k) for k in self.versions}

    def version(self, dist: str) -> str | None:
        return next((v for k, v in self.versions.items() if _norm(k) == _norm(dist)), None)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class LfRun:
    """The run as LLaMA-Factory will see it: its arguments, the DeepSpeed stage, the world size."""

    rc: RunConfig
    args: dict
    world: int = 1
    model_cfg: dict | None = None

    def get(self, key: str, default=None):
        value = self.args.get(key, default)
        return default if value is None else value

    def on(self, key: str) -> bool:
        return self.args.get(key) is True

    @property
    def stage(self) -> str:
        return str(self.get("stage", "sft"))

    @property
    def finetuning_type(self) -> str:
        return str(self.get("finetuning_type", "lora"))

    @property
    def zero3(self) -> bool:
        return self.rc.ds is not None and self.rc.zero_stage == 3

    def split(self, key: str) -> list[str]:
        """A comma-separated argument as LLaMA-Factory splits it (split_arg in hparams/*.py)."""
        value = self.args.get(key)
        if value is None:
            return []
        return [s.strip() for s in str(value).split(",")] if not isinstance(value, list) else [str(v) for v in value]


# -- the YAML as LLaMA-Factory reads it ------------------------------------------------------------

class _OmegaConfLikeLoader(yaml.SafeLoader):
    """PyYAML's safe loader with OmegaConf's scalar rules (omegaconf/_yaml.py: get_yaml_loader), which
    llamafactory-cli uses (hparams/parser.py: read_args): `1e-4` is a float there, a string in plain
    PyYAML; timestamps stay strings."""


_OmegaConfLikeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
        |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
        |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))
_OmegaConfLikeLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in _OmegaConfLikeLoader.yaml_implicit_resolvers.items()}


def llamafactory_args(rc: RunConfig) -> dict:
    """The YAML's keys and values as llamafactory-cli train passes them to HfArgumentParser.parse_dict."""
    if not rc.yaml_path:
        return dict(rc.yaml)
    try:
        data = yaml.load(Path(rc.yaml_path).read_text(encoding="utf-8", errors="replace"), Loader=_OmegaConfLikeLoader)
    except (OSError, yaml.YAMLError):
        return dict(rc.yaml)
    return data if isinstance(data, dict) else dict(rc.yaml)
