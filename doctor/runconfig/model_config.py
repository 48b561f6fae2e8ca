"""Find a model's config.json without loading weights: a local folder or file, the Hugging Face
or ModelScope cache, or (unless offline) the hub itself for config.json only."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

HUB_TIMEOUT_S = 10


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
        snaps = sorted((base / folder / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
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
            return json.loads(resp.read(1 << 20).decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def load_model_config(model: str) -> tuple[dict | None, str]:
    """(config dict or None, where it came from or why it was not found)."""
    p = Path(model).expanduser()
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            return None, f"{model} has no config.json"
    if p.is_file():
        try:
            return json.loads(p.read_text(encoding="utf-8")), str(p)
        except (OSError, ValueError) as exc:
            return None, f"{p}: cannot read config.json ({exc})"
    if model.count("/") != 1 or model.startswith((".", "/")):
        return None, f"{model}: no such folder"
    cached = _from_cache(model)
    if cached is not None:
        try:
            return json.loads(cached.read_text(encoding="utf-8")), str(cached)
        except (OSError, ValueError) as exc:
            return None, f"{cached}: cannot read ({exc})"
    cfg = _from_hub(model)
    if cfg is not None:
        return cfg, f"hub: {model}/config.json"
    return None, f"{model}: not a local folder, not in the Hugging Face/ModelScope cache, and the hub is not reachable"
