"""Shrinking a model's config.json to a tiny copy of the same architecture, and filling a
DeepSpeed config the way the HF Trainer would. Plain Python on dicts (no torch, no
transformers): the zero3_model worker uses it on the rank side, and the tests use it directly.

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


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def is_moe(cfg: dict) -> bool:
    """Whether a config (or its text sub-config) routes tokens to experts."""
    for d in [cfg, *(cfg.get(k) for k in SUB_CONFIGS)]:
        if isinstance(d, dict) and any((_int(d.get(k)) or 0) > 1 for k in EXPERT_KEYS):
            return True
    return False


def shrink_config(cfg: dict, keep_vocab: bool = False) -> tuple[dict, list[str]]:
    """A tiny copy of `cfg` (a config.json as a dict) and the lines saying what changed."""
    out = copy.deepcopy(cfg)
    notes: list[str] = []
    _shrink(out, notes, keep_vocab, "")
    return out, notes


def _note(notes, prefix, key, old, new):
    if old != new:
        notes.append(f"{prefix}{key}: {old} -> {new}")


def _set(d, key, new, notes, prefix):
    if key in d and d[key] is not None and d[key] != new:
        _note(notes, prefix, key, d[key], new)
        d[key] = new


def _shrink(d: dict, notes: list[str], keep_vocab: bool, prefix: str) -> None:
    for k in DROP_KEYS:
        if k in d:
            if k == "quantization_config":
                notes.append(f"{prefix}quantization_config dropped (the shrunk copy is not quantized)")
            d.pop(k)
    if "use_cache" in d:
        d["use_cache"] = False

    # depth, and everything that is indexed by layer
    old_layers = next((_int(d[k]) for k in LAYER_KEYS if _int(d.get(k))), None)
    if old_layers is None and _int(d.get("depth")):
        old_layers = d["depth"]
    new_layers = min(LAYERS, old_layers) if old_layers else None
    layer_types = d.get("layer_types")
    if old_layers and isinstance(layer_types, list) and len(layer_types) == old_layers:
        kinds = list(dict.fromkeys(str(t) for t in layer_types))
        n = max(min(LAYERS, old_layers), len(kinds))
        new_types = (kinds * n)[:n]
        if len(kinds) > 1:
            # keep the order of the original pattern: the first layer's kind first
            new_types = [layer_types[0]] + [t for t in kinds if t != layer_types[0]]
            new_types = (new_types * n)[:n]
        d["layer_types"] = new_types
        new_layers = n
        notes.append(f"{prefix}layer_types: one layer of each kind {new_types}")
    if old_layers and new_layers:
        for k in (*LAYER_KEYS, "depth"):
            if _int(d.get(k)) == old_layers:
                _set(d, k, new_layers, notes, prefix)
        for k, v in list(d.items()):
            if k != "layer_types" and isinstance(v, list) and len(v) == old_layers and old_layers > new_layers:
                d[k] = v[:new_layers]
                notes.append(f"{prefix}{k}: first {new_layers} of {old_layers} per-layer entries")
        for k in ("mlp_only_layers", "fullatt_block_indexes", "deepstack_visual_indexes", "full_attn_idxs"):
            if isinstance(d.get(k), list):
                kept = [i for i in d[k] if isinstance(i, int) and i < new_layers]
                if kept != d[k]:
                    _note(notes, prefix, k, d[k], kept)
                    d[k] = kept
        if _int(d.get("first_k_dense_replace")):
            _set(d, "first_k_dense_replace", 1, notes, prefix)  # layer 0 dense, layer 1 MoE: both kinds kept
        for k in ("decoder_sparse_step", "moe_layer_freq", "expert_interval"):
            if (_int(d.get(k)) or 0) > new_layers:
                _set(d, k, 1, notes, prefix)
        for k in ("max_window_layers",):
            if (_int(d.get(k)) or 0) > new_layers:
                _set(d, k, new_layers, notes, prefix)
        if _int(d.get("num_nextn_predict_layers")):
            _set(d, "num_nextn_predict_layers", 0, notes, prefix)

    # attention layout
    old_heads = next((_int(d[k]) for k in HEAD_KEYS if _int(d.get(k))), None)
    old_hidden = next((_int(d[k]) for k in HIDDEN_KEYS if _int(d.get(k))), None)
    old_head_dim = _int(d.get("head_dim")) or (old_hidden // old_heads if old_hidden and old_heads else None)
    heads = min(HEADS, old_heads) if old_heads else None
    if old_heads:
        for k in HEAD_KEYS:
            if _int(d.get(k)) == old_heads:
                _set(d, k, heads, notes, prefix)
        kv = _int(d.get("num_key_value_heads"))
        if kv:
            new_kv = heads if kv == old_heads else (1 if kv == 1 else max(1, heads // 2))
            _set(d, "num_key_value_heads", new_kv, notes, prefix)
        for k in ("multi_query_group_num", "num_kv_heads"):
            if _int(d.get(k)):
                _set(d, k, 1 if d[k] == 1 else max(1, (heads or HEADS) // 2), notes, prefix)
    mla = _int(d.get("kv_lora_rank")) is not None
    rot_old = rot_new = None
    if mla:
        rot_old = _int(d.get("qk_rope_head_dim"))
        for k, v in (("q_lora_rank", 32), ("kv_lora_rank", 32), ("qk_rope_head_dim", 8),
                     ("qk_nope_head_dim", 8), ("v_head_dim", 16), ("qk_head_dim", 16)):
            if _int(d.get(k)):
                _set(d, k, v, notes, prefix)
        if _int(d.get("head_dim")):
            _set(d, "head_dim", 8, notes, prefix)
        rot_new = 8 if rot_old else None
    elif _int(d.get("head_dim")):
        _set(d, "head_dim", HEAD_DIM, notes, prefix)
    for k, v in (("linear_key_head_dim", HEAD_DIM), ("linear_value_head_dim", HEAD_DIM),
                 ("linear_num_key_heads", 2), ("linear_num_value_heads", 4)):
        if _int(d.get(k)):
            _set(d, k, v, notes, prefix)
    if old_hidden:
        new_hidden = (heads or HEADS) * HEAD_DIM
        for k in HIDDEN_KEYS:
            if _int(d.get(k)) == old_hidden:
                _set(d, k, new_hidden, notes, prefix)
        for k in ("query_pre_attn_scalar",):
            if _int(d.get(k)) and old_head_dim and d[k] == old_head_dim:
                _set(d, k, HEAD_DIM, notes, prefix)
    if not mla and old_head_dim:
        partial = _partial_rotary(d)
        rot_old, rot_new = int(old_head_dim * partial), int(HEAD_DIM * partial)
    if rot_old and rot_new:
        for key in ("rope_scaling", "rope_parameters"):
            _shrink_rope(d.get(key), rot_old, rot_new, notes, f"{prefix}{key}.")

    # widths of the feed-forward layers
    for k in INTERMEDIATE_KEYS:
        if _int(d.get(k)):
            _set(d, k, INTERMEDIATE, notes, prefix)
    for k in ("moe_intermediate_size", "expert_intermediate_size"):
        if _int(d.get(k)):
            _set(d, k, MOE_INTERMEDIATE, notes, prefix)
    if _int(d.get("shared_expert_intermediate_size")):
        _set(d, "shared_expert_intermediate_size", 64, notes, prefix)

    # experts: fewer, same routing
    old_experts = next((_int(d[k]) for k in EXPERT_KEYS if (_int(d.get(k)) or 0) > 1), None)
    if old_experts:
        experts = min(EXPERTS, old_experts)
        for k in EXPERT_KEYS:
            if _int(d.get(k)) == old_experts:
                _set(d, k, experts, notes, prefix)
        for k in TOP_K_KEYS:
            if _int(d.get(k)):
                _set(d, k, max(1, min(TOP_K, d[k], experts)), notes, prefix)
        if (_int(d.get("n_shared_experts")) or 0) > 1:
            _set(d, "n_shared_experts", 1, notes, prefix)
        if (_int(d.get("n_group")) or 0) > 1:
            _set(d, "n_group", 1, notes, prefix)
        if (_int(d.get("topk_group")) or 0) > 1:
            _set(d, "topk_group", 1, notes, prefix)

    # vocabulary
    vocab = _int(d.get("vocab_size"))
    if vocab and not keep_vocab and vocab > SMALL_VOCAB:
        _set(d, "vocab_size", SMALL_VOCAB, notes, prefix)
        _remap_token_ids(d, SMALL_VOCAB, notes, prefix)
    if not any(k in d for k in ("rope_scaling", "rope_parameters", "rope_theta", "rotary_dim")):
        for k in ("n_positions", "max_position_embeddings"):  # learned position tables
            if (_int(d.get(k)) or 0) > 2048:
                _set(d, k, 2048, notes, prefix)

    for k in SUB_CONFIGS:
        if isinstance(d.get(k), dict):
            _shrink(d[k], notes, keep_vocab, f"{prefix}{k}.")


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


def shrunk_hidden(cfg: dict) -> int:
    for d in (cfg.get("text_config"), cfg.get("language_config"), cfg.get("llm_config"), cfg):
        if isinstance(d, dict):
            h = next((_int(d[k]) for k in HIDDEN_KEYS if _int(d.get(k))), None)
            if h:
                return h
    return HEADS * HEAD_DIM


# --- the DeepSpeed config, as the HF Trainer fills it ------------------------------------------

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


def _auto(v) -> bool:
    return isinstance(v, str) and v.strip().lower() == "auto"


def _truthy(v) -> bool:
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
    zero = cfg.get("zero_optimization")
    if not isinstance(zero, dict):
        zero = cfg["zero_optimization"] = {"stage": 0}
    stage = _int(zero.get("stage")) if not _auto(zero.get("stage")) else 3
    zero["stage"] = stage if stage is not None else 0

    micro = 1
    ga_src = yaml.get("gradient_accumulation_steps")
    ga = _int(ga_src) or _int(cfg.get("gradient_accumulation_steps")) or 1
    run_ga = min(ga, MAX_ACCUMULATION)
    if run_ga != ga:
        notes.append(f"gradient accumulation {ga} run as {run_ga} (enough to cross an accumulation boundary)")
    cfg["train_micro_batch_size_per_gpu"] = micro
    cfg["gradient_accumulation_steps"] = run_ga
    cfg["train_batch_size"] = micro * run_ga * world_size
    if _auto(cfg.get("gradient_clipping")):
        cfg["gradient_clipping"] = float(yaml.get("max_grad_norm", 1.0))

    # precision: "auto" follows the YAML (bf16/fp16 keys), as the HF Trainer does
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
        precision = "bf16" if keep_bf16 else "fp32"
    else:
        if want.get("bf16") and not bf16_ok:
            notes.append("bf16 requested but this GPU has no bf16: run in fp32")
            want["bf16"] = False
        for key in ("fp16", "bf16"):
            if isinstance(cfg.get(key), dict):
                cfg[key]["enabled"] = bool(want.get(key))
        precision = "bf16" if want.get("bf16") else "fp16" if want.get("fp16") else "fp32"

    if stage == 3 or stage in (1, 2):
        h2 = hidden_size * hidden_size
        for k, v in (("reduce_bucket_size", h2), ("stage3_prefetch_bucket_size", int(0.9 * h2)),
                     ("stage3_param_persistence_threshold", 10 * hidden_size)):
            if _auto(zero.get(k)):
                zero[k] = v
    for k, v in list(zero.items()):
        if _auto(v):
            zero.pop(k)
            notes.append(f"zero_optimization.{k}: 'auto' that the HF Trainer leaves alone: dropped")

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
    if "scheduler" in cfg:
        cfg.pop("scheduler")
        notes.append("scheduler section not used (a learning-rate schedule does not change what ZeRO-3 does)")
    for k in MONITOR_KEYS:
        if k in cfg:
            cfg.pop(k)
            notes.append(f"{k} section dropped (the probe writes nothing outside its temporary folder)")
    cfg["steps_per_print"] = 10 ** 9
    cfg["wall_clock_breakdown"] = False
    facts = {"stage": zero["stage"], "accumulation": run_ga, "accumulation_asked": ga, "precision": precision,
             "optimizer": optimizer, "offload": offload, "lr": lr,
             "gather_on_save": _truthy(zero.get("stage3_gather_16bit_weights_on_model_save",
                                                zero.get("gather_16bit_weights_on_model_save", False)))}
    return cfg, facts, notes


# --- MoE blocks that must be ZeRO-3 leaf modules -----------------------------------------------

# model_type -> (module of the class, class name), as LLaMA-Factory 0.9.5 sets them
# (llamafactory/model/model_utils/moe.py: add_z3_leaf_module). A class given by name only lives in
# the model's remote code.
LLAMAFACTORY_LEAF = {
    "dbrx": ("transformers.models.dbrx.modeling_dbrx", "DbrxFFN"),
    "deepseek_v2": (None, "DeepseekV2MoE"),
    "deepseek_v3": (None, "DeepseekV3MoE"),
    "kimi_vl": (None, "DeepseekV3MoE"),
    "hy_v3": (None, "HYV3MoE"),
    "ernie4_5_moe": ("transformers.models.ernie4_5_moe.modeling_ernie4_5_moe", "Ernie4_5_MoeSparseMoeBlock"),
    "granitemoe": ("transformers.models.granitemoe.modeling_granitemoe", "GraniteMoeMoE"),
    "glm4_moe": ("transformers.models.glm4_moe.modeling_glm4_moe", "Glm4MoeMoE"),
    "glm4_moe_lite": ("transformers.models.glm4_moe_lite.modeling_glm4_moe_lite", "Glm4MoeLiteMoE"),
    "glm4v_moe": ("transformers.models.glm4v_moe.modeling_glm4v_moe", "Glm4vMoeTextMoE"),
    "gpt_oss": ("transformers.models.gpt_oss.modeling_gpt_oss", "GptOssMLP"),
    "jamba": ("transformers.models.jamba.modeling_jamba", "JambaSparseMoeBlock"),
    "jetmoe": ("transformers.models.jetmoe.modeling_jetmoe", "JetMoeMoA,JetMoeMoE"),
    "llama4": ("transformers.models.llama4.modeling_llama4", "Llama4TextMoe"),
    "mixtral": ("transformers.models.mixtral.modeling_mixtral", "MixtralSparseMoeBlock"),
    "olmoe": ("transformers.models.olmoe.modeling_olmoe", "OlmoeSparseMoeBlock"),
    "phimoe": ("transformers.models.phimoe.modeling_phimoe", "PhimoeSparseMoeBlock"),
    "qwen2_moe": ("transformers.models.qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock"),
    "qwen3_moe": ("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock"),
    "qwen3_vl_moe": ("transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe", "Qwen3VLMoeTextSparseMoeBlock"),
    "qwen3_omni_moe": (None, "Qwen3OmniMoeThinkerTextSparseMoeBlock"),
    "qwen3_next": ("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextSparseMoeBlock"),
    "qwen3_5_moe": ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeSparseMoeBlock"),
}
# DeepSpeed >= 0.18 flags these by default (zero_optimization.leaf_module.classes)
DEEPSPEED_DEFAULT_LEAF = ("MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock")


def llamafactory_leaf_classes(model_type: str | None, text_model_type: str | None = None) -> list[str]:
    """Class names LLaMA-Factory 0.9.5 marks as ZeRO-3 leaves for this model type."""
    names: list[str] = []
    for mt in (model_type, text_model_type):
        if mt in LLAMAFACTORY_LEAF:
            names += LLAMAFACTORY_LEAF[mt][1].split(",")
    if text_model_type == "qwen3_moe" and "Qwen3MoeSparseMoeBlock" not in names:
        names.append("Qwen3MoeSparseMoeBlock")
    return list(dict.fromkeys(names))
