"""The rank-side helpers of zero3.model, on dicts (no processes): shrinking a config.json
(probes/workers/_shrink.py), filling a DeepSpeed config as the HF Trainer does (_ds_config.py)
and the MoE tables (_moe.py). One test builds each shrunk family with transformers, on the CPU."""

import pytest
from mgft_doctor.probes.workers._ds_config import fill_ds_config
from mgft_doctor.probes.workers._moe import is_moe, llamafactory_leaf_classes, num_experts
from mgft_doctor.probes.workers._shrink import shrink_config, shrunk_hidden


SHRINK_FAMILIES = ["LlamaConfig", "MistralConfig", "Qwen2Config", "Qwen3Config", "MixtralConfig", "Qwen2MoeConfig",
                   "Qwen3MoeConfig", "GemmaConfig", "Gemma2Config", "Gemma3TextConfig", "Phi3Config", "PhiConfig",
                   "DeepseekV3Config", "GptOssConfig", "OlmoeConfig", "GPT2Config", "Glm4MoeConfig", "Qwen3NextConfig"]


def test_shrunk_configs_build_and_run():
    """Every family's default (full-size) config shrinks to a model of well under a million
    parameters that builds and trains one step without DeepSpeed, keeping its kind of layers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for name in SHRINK_FAMILIES:
        full = getattr(transformers, name)()
        d, _ = shrink_config(full.to_dict())
        small = type(full).from_dict(d)
        model = transformers.AutoModelForCausalLM.from_config(small)
        n = sum(p.numel() for p in model.parameters())
        assert n < 1_000_000, (name, n)
        ids = torch.randint(0, small.vocab_size, (1, 8))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        assert torch.isfinite(loss), name
        assert is_moe(d) == is_moe(full.to_dict()), name
        if getattr(full, "layer_types", None):
            assert set(small.layer_types) == set(full.layer_types), name  # one layer of each kind


def test_shrink_keeps_routing_and_layout():
    d, _ = shrink_config({"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
                                 "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256,
                                 "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3,
                                 "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                                 "vocab_size": 129280, "eos_token_id": 1, "pad_token_id": 129279,
                                 "quantization_config": {"quant_method": "fp8"}})
    assert d["num_hidden_layers"] == 2 and d["first_k_dense_replace"] == 1  # a dense layer, then an MoE layer
    assert d["n_routed_experts"] == 4 and d["num_experts_per_tok"] == 2 and d["n_group"] == 1
    assert d["kv_lora_rank"] == 32 and d["qk_rope_head_dim"] == 8  # still MLA
    assert d["vocab_size"] == 512 and d["pad_token_id"] == 511 and d["eos_token_id"] == 1
    assert "quantization_config" not in d
    kept, _ = shrink_config({"vocab_size": 151936, "hidden_size": 4096, "num_attention_heads": 32,
                                    "num_key_value_heads": 8}, keep_vocab=True)
    assert kept["vocab_size"] == 151936 and kept["num_key_value_heads"] == 2  # grouped-query stays grouped
    phi, _ = shrink_config({"hidden_size": 3072, "num_attention_heads": 32, "rope_scaling": {
        "type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}})
    assert len(phi["rope_scaling"]["short_factor"]) == 8  # head_dim 16 -> 8 rotary frequencies


def test_ds_config_filled_like_the_hf_trainer(tmp_path):
    cfg, facts, notes = fill_ds_config(None, yaml={"gradient_accumulation_steps": 16, "bf16": True},
                                              world_size=2, hidden_size=64, on_gpu=False, bf16_ok=False,
                                              scratch_dir=str(tmp_path))
    assert cfg["train_micro_batch_size_per_gpu"] == 1 and cfg["gradient_accumulation_steps"] == 4
    assert cfg["train_batch_size"] == 8 and cfg["gradient_clipping"] == 1.0
    z = cfg["zero_optimization"]
    assert z["reduce_bucket_size"] == 64 * 64 and z["stage3_param_persistence_threshold"] == 640
    assert cfg["bf16"]["enabled"] is False and facts["precision"] == "fp32" and facts["optimizer"] == "torch-adamw"
    assert facts["gather_on_save"] is True and not any(v == "auto" for v in z.values())
    assert any("bf16 requested: run in fp32 on CPU" in n for n in notes)
    assert any("accumulation 16 run as 4" in n for n in notes)
    user = {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
            "scheduler": {"type": "WarmupLR"}, "tensorboard": {"enabled": True, "output_path": "/home/u/tb"},
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}}
    cfg, facts, _ = fill_ds_config(user, yaml={"learning_rate": 2e-5}, world_size=2, hidden_size=64,
                                              on_gpu=True, bf16_ok=True, scratch_dir=str(tmp_path))
    assert cfg["optimizer"]["params"]["lr"] == 2e-5 and facts["optimizer"] == "config"
    assert "scheduler" not in cfg and "tensorboard" not in cfg
    assert cfg["zero_optimization"]["offload_optimizer"]["nvme_path"].startswith(str(tmp_path))
    cfg, facts, _ = fill_ds_config({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
                                          yaml={}, world_size=2, hidden_size=64, on_gpu=False, bf16_ok=False,
                                          scratch_dir=str(tmp_path))
    assert facts["optimizer"] == "ds-cpu-adam"  # what accelerate maps torch AdamW to under offload


def test_llamafactory_leaf_table():
    assert llamafactory_leaf_classes("mixtral") == ["MixtralSparseMoeBlock"]
    assert llamafactory_leaf_classes("jetmoe") == ["JetMoeMoA", "JetMoeMoE"]
    assert llamafactory_leaf_classes("internvl", "qwen3_moe") == ["Qwen3MoeSparseMoeBlock"]
    assert llamafactory_leaf_classes("llama") == []


def test_experts_counted_in_the_text_sub_config():
    assert num_experts({"model_type": "llava", "text_config": {"num_local_experts": 8}}) == 8
    assert num_experts({"num_experts": 1, "n_routed_experts": 0}) == 0 and not is_moe({"num_experts": True})


def test_shrunk_hidden_reads_the_text_model_first():
    assert shrunk_hidden({"hidden_size": 1024, "text_config": {"hidden_size": 64}}) == 64
    assert shrunk_hidden({}) == 64  # HEADS x HEAD_DIM
