"""Find a model's config.json without loading weights: a local folder or file, the Hugging Face
or ModelScope cache, or (unless offline) the hub itself for config.json only. The file is read as
the run configs are (reading.py: a regular file, a size cap, every value walked with a bound),
so an odd config.json is a reason to skip, never a crash."""

from __future__ import annotations

import os
import re
import stat
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import InputError
from .reading import check_tree, parse_json, read_text

HUB_TIMEOUT_S = 10
# Hugging Face repo ids: org/name, letters, digits, '-', '_', '.', at most 96 characters each
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
# the architecture fields memory.py multiplies, and how large each can plausibly be: the arithmetic
# builds a list per expert and per layer, so a 2**31 there would take the host's memory
_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "n_shared_experts", "num_hidden_layers", "n_layer",
           "num_layers", "first_k_dense_replace", "decoder_sparse_step")
_SIZES = ("hidden_size", "n_embd", "d_model", "num_attention_heads", "n_head", "num_key_value_heads", "head_dim",
          "intermediate_size", "ffn_dim", "vocab_size", "moe_intermediate_size", "shared_expert_intermediate_size")
ARCH_LIMITS = {**{k: 1 << 16 for k in _COUNTS}, **{k: 1 << 26 for k in _SIZES}}


def _as_number(v) -> float | None:
    """A number, or a string int() would take for one (memory.py reads them with int())."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and len(v) < 4000 and re.fullmatch(r"\s*[+-]?\d+\s*", v):
        return int(v)
    return None


def looks_like_hub_id(model: str) -> bool:
    """org/name as the hub spells repo ids (not a path: no leading '.', '/' or '~', no '..')."""
    return bool(HUB_ID.fullmatch(model)) and ".." not in model


def missing_model(model: str) -> str | None:
    """Why `--model` names nothing the doctor can use (one line), or None: an existing path, or
    something shaped like a hub id (its config.json comes from the cache or the hub)."""
    if _exists(Path(model).expanduser()) or looks_like_hub_id(model):
        return None
    shown = model if len(model) <= 120 else model[:119] + "…"
    return (f"--model {shown}: no such model folder (a hub id is org/name; the doctor reads only its "
            "config.json, from the Hugging Face cache or the hub)")


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except (OSError, ValueError):  # a name too long, a NUL byte
        return False


def _kind(p: Path) -> str | None:
    """'dir', 'file' (anything else that exists: read_text refuses it in its words) or None."""
    try:
        return "dir" if stat.S_ISDIR(os.stat(p).st_mode) else "file"
    except (OSError, ValueError):
        return None


def read_config_json(p: Path) -> tuple[dict | None, str]:
    """(the config, where) or (None, why not) for one config.json on disk."""
    try:
        cfg = parse_json(read_text(str(p), "config.json"), str(p))
        if not isinstance(cfg, dict):
            return None, f"{p}: cannot read config.json (not a JSON object)"
        check_tree(cfg, str(p))
    except InputError as exc:
        return None, f"cannot read config.json: {exc}"
    why = _arch_problem(cfg, p)
    return (None, why) if why else (cfg, str(p))


def _arch_problem(cfg: dict, where) -> str | None:
    for section in ("text_config", "llm_config"):
        if section in cfg and cfg[section] is not None and not isinstance(cfg[section], dict):
            return f"{where}: {section}: expected a mapping, got a {type(cfg[section]).__name__}"
    for prefix, node in (("", cfg), ("text_config.", cfg.get("text_config")), ("llm_config.", cfg.get("llm_config"))):
        for key, limit in ARCH_LIMITS.items() if isinstance(node, dict) else ():
            v = _as_number(node.get(key))
            if v is not None and not 0 <= v <= limit:
                shown = f"{v:g}" if isinstance(v, float) or abs(v) < 10 ** 15 else f"{str(v)[:15]}… ({len(str(v))} digits)"
                return f"{where}: {prefix}{key}: {shown} is out of range for a model size (at most {limit:,})"
    return None


def _hf_cache_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    dirs.append(home / "hub")
    return dirs


def _from_cache(model_id: str) -> Path | None:
    folder = "models--" + model_id.replace("/", "--")
    for base in _hf_cache_dirs():
        try:
            snaps = sorted((base / folder / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime,
                           reverse=True)
        except OSError:
            continue
        if snaps:
            return snaps[0]
    ms = Path(os.environ.get("MODELSCOPE_CACHE", Path.home() / ".cache" / "modelscope" / "hub"))
    for candidate in (ms / model_id / "config.json", ms / "models" / model_id / "config.json"):
        if candidate.is_file():
            return candidate
    return None


def _from_hub(model_id: str) -> dict | None:
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True") or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    req = urllib.request.Request(f"{endpoint}/{model_id}/resolve/main/config.json")
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=HUB_TIMEOUT_S) as resp:
            cfg = parse_json(resp.read(1 << 20).decode("utf-8", "replace"), f"hub: {model_id}/config.json")
        if isinstance(cfg, dict):
            check_tree(cfg, f"hub: {model_id}/config.json")
            return cfg if _arch_problem(cfg, model_id) is None else None
    except (urllib.error.URLError, OSError, ValueError, InputError):
        pass
    return None


def load_model_config(model: str) -> tuple[dict | None, str]:
    """(config dict or None, where it came from or why it was not found)."""
    p = Path(model).expanduser()
    if _kind(p) == "dir":
        p = p / "config.json"
        if _kind(p) is None:
            return None, f"{model} has no config.json"
    if _kind(p) is not None:
        return read_config_json(p)
    if not looks_like_hub_id(model):
        return None, f"{model if len(model) <= 120 else model[:119] + '…'}: no such folder"
    cached = _from_cache(model)
    if cached is not None:
        return read_config_json(cached)
    cfg = _from_hub(model)
    if cfg is not None:
        return cfg, f"hub: {model}/config.json"
    return None, f"{model}: not a local folder, not in the Hugging Face/ModelScope cache, and the hub is not reachable"
