"""Shrinking a model's config.json to a tiny copy of the same architecture. Plain Python on dicts
(no torch, no transformers): the zero3_model worker uses it on the rank side, and the tests use
it directly. It also holds what the keys of a config.json mean (the key tables below), which
_moe.py reads too.

What a shrunk config keeps: the model type and its code, the kinds of layers (one layer of each
kind in `layer_types`, at least two), attention layout (grouped-query or multi-query stays so,
multi-head latent attention stays MLA), the MoE routing (experts, top-k, shared experts, grouped
routing, dense-first layers), tied embeddings, rotary scaling, and the vocabulary when asked
(a local tokenizer is used). What it shrinks: depth, widths, head counts and sizes, expert counts.
"""

from __future__ import annotations

import copy

LAYERS = 2
HEADS = 4
HEAD_DIM = 16
INTERMEDIATE = 128
MOE_INTERMEDIATE = 32
EXPERTS = 4
TOP_K = 2
SMALL_VOCAB = 512

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
INTERMEDIATE_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "inner_hidden_size")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "num_experts_per_token")
# Sub-configs that describe a network of their own (multimodal models): shrunk the same way.
SUB_CONFIGS = ("text_config", "language_config", "llm_config", "vision_config", "audio_config")
DROP_KEYS = ("quantization_config", "torch_dtype", "dtype", "_name_or_path", "transformers_version",
             "pretraining_tp")
# lists of layer indices: only those of the layers kept stay
LAYER_INDEX_KEYS = ("mlp_only_layers", "fullatt_block_indexes", "deepstack_visual_indexes", "full_attn_idxs")
# "every n-th layer is MoE": past the shrunk depth, every layer is
LAYER_STEP_KEYS = ("decoder_sparse_step", "moe_layer_freq", "expert_interval")
MLA_SIZES = (("q_lora_rank", 32), ("kv_lora_rank", 32), ("qk_rope_head_dim", 8),
             ("qk_nope_head_dim", 8), ("v_head_dim", 16), ("qk_head_dim", 16))
LINEAR_ATTENTION_SIZES = (("linear_key_head_dim", HEAD_DIM), ("linear_value_head_dim", HEAD_DIM),
                          ("linear_num_key_heads", 2), ("linear_num_value_heads", 4))


def int_value(v):
    """v when it is an int (not a bool), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _first_int(d: dict, keys) -> int | None:
    return next((int_value(d[k]) for k in keys if int_value(d.get(k))), None)


def shrink_config(cfg: dict, keep_vocab: bool = False) -> tuple[dict, list[str]]:
    """A tiny copy of `cfg` (a config.json as a dict) and the lines saying what changed."""
    out = copy.deepcopy(cfg)
    notes: list[str] = []
    _shrink(out, notes, keep_vocab, "")
    return out, notes


def shrunk_hidden(cfg: dict) -> int:
    for d in (cfg.get("text_config"), cfg.get("language_config"), cfg.get("llm_config"), cfg):
        if isinstance(d, dict):
            h = _first_int(d, HIDDEN_KEYS)
            if h:
                return h
    return HEADS * HEAD_DIM


def _note(notes, prefix, key, old, new):
    if old != new:
        notes.append(f"{prefix}{key}: {old} -> {new}")


def _set(d, key, new, notes, prefix):
    if key in d and d[key] is not None and d[key] != new:
        _note(notes, prefix, key, d[key], new)
        d[key] = new


def _shrink(d: dict, notes: list[str], keep_vocab: bool, prefix: str) -> None:
    _drop(d, notes, prefix)
    _shrink_depth(d, notes, prefix)
    _shrink_attention(d, notes, prefix)
    _shrink_widths(d, notes, prefix)
    _shrink_experts(d, notes, prefix)
    _shrink_vocabulary(d, notes, keep_vocab, prefix)
    for k in SUB_CONFIGS:
        if isinstance(d.get(k), dict):
            _shrink(d[k], notes, keep_vocab, f"{prefix}{k}.")


def _drop(d: dict, notes: list[str], prefix: str) -> None:
    """What the shrunk copy must not carry: quantization, dtypes, the original's path, the KV cache."""
    for k in DROP_KEYS:
        if k in d:
            if k == "quantization_config":
                notes.append(f"{prefix}quantization_config dropped (the shrunk copy is not quantized)")
            d.pop(k)
    if "use_cache" in d:
        d["use_cache"] = False


# --- depth, and everything that is indexed by layer ----------------------------------------------

def _shrink_depth(d: dict, notes: list[str], prefix: str) -> None:
    old_layers = _first_int(d, LAYER_KEYS)
    if old_layers is None and int_value(d.get("depth")):
        old_layers = d["depth"]
    new_layers = min(LAYERS, old_layers) if old_layers else None
    kinds = _one_layer_of_each_kind(d, old_layers, notes, prefix)
    if kinds:
        new_layers = kinds
    if old_layers and new_layers:
        _set_depth(d, old_layers, new_layers, notes, prefix)
        _fit_layer_indices(d, new_layers, notes, prefix)


def _one_layer_of_each_kind(d: dict, old_layers, notes, prefix) -> int | None:
    """`layer_types` cut to one layer of each kind (at least LAYERS), in the original's order:
    the first layer's kind first. Returns the new depth, None without layer_types."""
    layer_types = d.get("layer_types")
    if not (old_layers and isinstance(layer_types, list) and len(layer_types) == old_layers):
        return None
    kinds = list(dict.fromkeys(str(t) for t in layer_types))
    n = max(min(LAYERS, old_layers), len(kinds))
    new_types = (kinds * n)[:n]
    if len(kinds) > 1:
        new_types = [layer_types[0]] + [t for t in kinds if t != layer_types[0]]
        new_types = (new_types * n)[:n]
    d["layer_types"] = new_types
    notes.append(f"{prefix}layer_types: one layer of each kind {new_types}")
    return n


def _set_depth(d: dict, old_layers: int, new_layers: int, notes, prefix) -> None:
    """The depth keys, and every per-layer list (one entry per layer) cut to the layers kept."""
    for k in (*LAYER_KEYS, "depth"):
        if int_value(d.get(k)) == old_layers:
            _set(d, k, new_layers, notes, prefix)
    for k, v in list(d.items()):
        if k != "layer_types" and isinstance(v, list) and len(v) == old_layers and old_layers > new_layers:
            d[k] = v[:new_layers]
            notes.append(f"{prefix}{k}: first {new_layers} of {old_layers} per-layer entries")


def _fit_layer_indices(d: dict, new_layers: int, notes, prefix) -> None:
    """Layer indices and layer patterns that still name layers of the shrunk depth."""
    for k in LAYER_INDEX_KEYS:
        if isinstance(d.get(k), list):
            kept = [i for i in d[k] if isinstance(i, int) and i < new_layers]
            if kept != d[k]:
                _note(notes, prefix, k, d[k], kept)
                d[k] = kept
    if int_value(d.get("first_k_dense_replace")):
        _set(d, "first_k_dense_replace", 1, notes, prefix)  # layer 0 dense, layer 1 MoE: both kinds kept
    for k in LAYER_STEP_KEYS:
        if (int_value(d.get(k)) or 0) > new_layers:
            _set(d, k, 1, notes, prefix)
    if (int_value(d.get("max_window_layers")) or 0) > new_layers:
        _set(d, "max_window_layers", new_layers, notes, prefix)
    if int_value(d.get("num_nextn_predict_layers")):
        _set(d, "num_nextn_predict_layers", 0, notes, prefix)


# --- attention layout ----------------------------------------------------------------------------

def _shrink_attention(d: dict, notes: list[str], prefix: str) -> None:
    """Fewer, smaller heads in the same layout, the hidden size that follows from them, and the
    rotary tables that follow the head size."""
    old_heads = _first_int(d, HEAD_KEYS)
    old_hidden = _first_int(d, HIDDEN_KEYS)
    old_head_dim = int_value(d.get("head_dim")) or (old_hidden // old_heads if old_hidden and old_heads else None)
    heads = _shrink_heads(d, old_heads, notes, prefix)
    mla, rot_old, rot_new = _shrink_head_dims(d, notes, prefix)
    if old_hidden:
        _shrink_hidden(d, old_hidden, old_head_dim, heads, notes, prefix)
    if not mla and old_head_dim:
        partial = _partial_rotary(d)
        rot_old, rot_new = int(old_head_dim * partial), int(HEAD_DIM * partial)
    if rot_old and rot_new:
        for key in ("rope_scaling", "rope_parameters"):
            _shrink_rope(d.get(key), rot_old, rot_new, notes, f"{prefix}{key}.")


def _shrink_heads(d: dict, old_heads, notes, prefix) -> int | None:
    """At most HEADS query heads; key/value heads stay as many (MHA), one (MQA) or fewer (GQA)."""
    if not old_heads:
        return None
    heads = min(HEADS, old_heads)
    for k in HEAD_KEYS:
        if int_value(d.get(k)) == old_heads:
            _set(d, k, heads, notes, prefix)
    kv = int_value(d.get("num_key_value_heads"))
    if kv:
        new_kv = heads if kv == old_heads else (1 if kv == 1 else max(1, heads // 2))
        _set(d, "num_key_value_heads", new_kv, notes, prefix)
    for k in ("multi_query_group_num", "num_kv_heads"):
        if int_value(d.get(k)):
            _set(d, k, 1 if d[k] == 1 else max(1, (heads or HEADS) // 2), notes, prefix)
    return heads


def _shrink_head_dims(d: dict, notes, prefix) -> tuple[bool, int | None, int | None]:
    """Head sizes; multi-head latent attention keeps its low-rank projections, smaller.
    Returns (MLA?, rotary dimension before, after) — the rotary ones for MLA only."""
    mla = int_value(d.get("kv_lora_rank")) is not None
    rot_old = rot_new = None
    if mla:
        rot_old = int_value(d.get("qk_rope_head_dim"))
        for k, v in MLA_SIZES:
            if int_value(d.get(k)):
                _set(d, k, v, notes, prefix)
        if int_value(d.get("head_dim")):
            _set(d, "head_dim", 8, notes, prefix)
        rot_new = 8 if rot_old else None
    elif int_value(d.get("head_dim")):
        _set(d, "head_dim", HEAD_DIM, notes, prefix)
    for k, v in LINEAR_ATTENTION_SIZES:
        if int_value(d.get(k)):
            _set(d, k, v, notes, prefix)
    return mla, rot_old, rot_new


def _shrink_hidden(d: dict, old_hidden: int, old_head_dim, heads, notes, prefix) -> None:
    new_hidden = (heads or HEADS) * HEAD_DIM
    for k in HIDDEN_KEYS:
        if int_value(d.get(k)) == old_hidden:
            _set(d, k, new_hidden, notes, prefix)
    if int_value(d.get("query_pre_attn_scalar")) and old_head_dim and d["query_pre_attn_scalar"] == old_head_dim:
        _set(d, "query_pre_attn_scalar", HEAD_DIM, notes, prefix)


def _partial_rotary(d: dict) -> float:
    for src in (d, d.get("rope_parameters"), d.get("rope_scaling")):
        if isinstance(src, dict) and isinstance(src.get("partial_rotary_factor"), (int, float)):
            return float(src["partial_rotary_factor"])
    return 1.0


def _shrink_rope(rope, rot_old: int, rot_new: int, notes, prefix) -> None:
    """Per-frequency lists (longrope's short/long factors) follow the rotary dimension;
    mrope sections are rescaled to sum to half of it."""
    if not isinstance(rope, dict):
        return
    for k, v in list(rope.items()):
        if isinstance(v, dict):
            _shrink_rope(v, rot_old, rot_new, notes, f"{prefix}{k}.")
        elif isinstance(v, list) and len(v) == rot_old // 2 and rot_old // 2 > 0 and k != "mrope_section":
            rope[k] = v[: rot_new // 2]
            notes.append(f"{prefix}{k}: first {rot_new // 2} of {len(v)} factors")
        elif k == "mrope_section" and isinstance(v, list) and v and sum(v) == rot_old // 2:
            half = rot_new // 2
            new = [max(1, round(x * half / sum(v))) for x in v]
            new[0] += half - sum(new)
            rope[k] = new
            _note(notes, prefix, k, v, new)


# --- widths, experts, vocabulary -----------------------------------------------------------------

def _shrink_widths(d: dict, notes: list[str], prefix: str) -> None:
    """The feed-forward layers' widths (dense, per expert, shared expert)."""
    for k in INTERMEDIATE_KEYS:
        if int_value(d.get(k)):
            _set(d, k, INTERMEDIATE, notes, prefix)
    for k in ("moe_intermediate_size", "expert_intermediate_size"):
        if int_value(d.get(k)):
            _set(d, k, MOE_INTERMEDIATE, notes, prefix)
    if int_value(d.get("shared_expert_intermediate_size")):
        _set(d, "shared_expert_intermediate_size", 64, notes, prefix)


def _shrink_experts(d: dict, notes: list[str], prefix: str) -> None:
    """Fewer experts, the same routing: top-k, one shared expert, one expert group."""
    old_experts = next((int_value(d[k]) for k in EXPERT_KEYS if (int_value(d.get(k)) or 0) > 1), None)
    if not old_experts:
        return
    experts = min(EXPERTS, old_experts)
    for k in EXPERT_KEYS:
        if int_value(d.get(k)) == old_experts:
            _set(d, k, experts, notes, prefix)
    for k in TOP_K_KEYS:
        if int_value(d.get(k)):
            _set(d, k, max(1, min(TOP_K, d[k], experts)), notes, prefix)
    for k in ("n_shared_experts", "n_group", "topk_group"):
        if (int_value(d.get(k)) or 0) > 1:
            _set(d, k, 1, notes, prefix)


def _shrink_vocabulary(d: dict, notes: list[str], keep_vocab: bool, prefix: str) -> None:
    """SMALL_VOCAB tokens unless a tokenizer is used; learned position tables of at most 2048."""
    vocab = int_value(d.get("vocab_size"))
    if vocab and not keep_vocab and vocab > SMALL_VOCAB:
        _set(d, "vocab_size", SMALL_VOCAB, notes, prefix)
        _remap_token_ids(d, SMALL_VOCAB, notes, prefix)
    if not any(k in d for k in ("rope_scaling", "rope_parameters", "rope_theta", "rotary_dim")):
        for k in ("n_positions", "max_position_embeddings"):  # learned position tables
            if (int_value(d.get(k)) or 0) > 2048:
                _set(d, k, 2048, notes, prefix)


def _remap_token_ids(d: dict, vocab: int, notes, prefix) -> None:
    """Special-token ids beyond the shrunk vocabulary move to its top (distinct ones stay distinct)."""
    taken: dict[int, int] = {}
    nxt = vocab - 1

    def remap(i):
        nonlocal nxt
        if not isinstance(i, int) or isinstance(i, bool) or i < vocab:
            return i
        if i not in taken:
            taken[i] = nxt
            nxt -= 1
        return taken[i]

    for k, v in list(d.items()):
        if k.endswith(("token_id", "token_index")):
            new = [remap(x) for x in v] if isinstance(v, list) else remap(v)
            if new != v:
                _note(notes, prefix, k, v, new)
                d[k] = new
