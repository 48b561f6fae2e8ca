"""QLoRA in the run checks: the base weights config.memory counts for 4- and 8-bit quantization
(QLoRA's published 4.127 bits per NF4 weight with double quantization; the linear layers a
quantizer really replaces, counted on models transformers builds)."""

from __future__ import annotations

import json

import pytest

from mgft_doctor.check.context import Context, Options
from mgft_doctor.check.facts import Facts
from mgft_doctor.runconfig import memory as me

LLAMA_7B = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, intermediate_size=11008,
                num_attention_heads=32, vocab_size=32000, tie_word_embeddings=False)


def test_bytes_per_weight_are_qloras_figures():
    assert me.Quantization("bnb", 4).bytes_per_weight * 8 == pytest.approx(4.127, abs=0.001)  # NF4 + double quant
    assert me.Quantization("bnb", 4, double_quant=False).bytes_per_weight * 8 == pytest.approx(4.5)
    assert me.Quantization("bnb", 8).bytes_per_weight == 1.0
    assert me.Quantization("hqq", 4).bytes_per_weight == pytest.approx(0.5625)


@pytest.mark.parametrize("name", ["llama", "qwen2_moe", "mixtral"])
def test_quantizable_weights_are_the_linear_layers_transformers_builds(name):
    """What replace_with_bnb_linear would replace: nn.Linear weights but the output head (fused MoE
    experts are parameters, not nn.Linear, in transformers 5)."""
    import torch
    import transformers

    small = dict(hidden_size=64, num_hidden_layers=3, intermediate_size=176, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=False)
    extra = {"qwen2_moe": dict(num_experts=4, moe_intermediate_size=48, shared_expert_intermediate_size=96,
                               num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[]),
             "mixtral": dict(num_local_experts=4, num_experts_per_tok=2)}.get(name, {})
    cfg = transformers.AutoConfig.for_model(name, **small, **extra)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    linear = sum(m.weight.numel() for n, m in model.named_modules()
                 if type(m) is torch.nn.Linear and not n.endswith("lm_head") and "shared_expert_gate" not in n)
    assert me.shape_from_config(cfg.to_dict()).quantizable_params == linear


def test_a_qlora_estimate_is_no_longer_a_bf16_lora_estimate():
    shape = me.shape_from_config(LLAMA_7B)
    bf16 = me.frozen_weight_bytes(shape)
    nf4 = me.frozen_weight_bytes(shape, me.Quantization("bnb", 4))
    int8 = me.frozen_weight_bytes(shape, me.Quantization("bnb", 8))
    # 6.48 B linear weights at 4.127 bits + 0.26 B embedding/head weights in bf16: ~3.9 GB (QLoRA's 7B)
    assert nf4 == pytest.approx(3.87e9, rel=0.02) and int8 == pytest.approx(7.0e9, rel=0.02) and bf16 > 13e9
    lora = {(p.stage, p.offload): p.gpu_bytes for p in me.plans(shape, 1, 1, 1, 1024, 8)}
    qlora = {(p.stage, p.offload): p.gpu_bytes for p in me.plans(shape, 1, 1, 1, 1024, 8, quant=me.Quantization("bnb", 4))}
    assert lora[(0, "none")] - qlora[(0, "none")] == pytest.approx(bf16 - nf4 - me.dequant_buffer(shape, me.Quantization("bnb", 4)))


@pytest.mark.parametrize("args,cfg,want", [
    ({"quantization_bit": 4}, {}, me.Quantization("bnb", 4)),
    ({"quantization_bit": 4, "double_quantization": False}, {}, me.Quantization("bnb", 4, False)),
    ({"quantization_bit": 8, "quantization_method": "eetq"}, {}, me.Quantization("eetq", 8)),
    ({"quantization_bit": 3}, {}, None),  # LLaMA-Factory refuses it
    ({"quantization_bit": 4, "quantization_method": "gptq"}, {}, None),  # not quantized on the fly
    ({}, {"quantization_config": {"quant_method": "gptq", "bits": 4}}, me.Quantization("gptq", 4)),
    ({"quantization_bit": 4}, {"quantization_config": {"quant_method": "fp8"}}, None),  # de-quantized on load
    ({}, {}, None),
])
def test_how_llamafactory_holds_the_base_weights(args, cfg, want):
    assert me.quantization_of(args, cfg) == want


def _memory(tmp_path, extra: str) -> dict:
    from mgft_doctor.probes import config_memory

    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text(json.dumps(LLAMA_7B))
    (tmp_path / "t.yaml").write_text(f"model_name_or_path: {tmp_path / 'm'}\nstage: sft\nfinetuning_type: lora\n{extra}")
    ctx = Context(Options(nproc=1, config=str(tmp_path / "t.yaml")))
    ctx.__dict__["facts"] = Facts({"device_count": 1, "devices": [{"total_memory": 24 << 30, "bf16": True}]})
    return config_memory.run(ctx)


def test_config_memory_counts_4bit_weights(tmp_path):
    lora, qlora = _memory(tmp_path, ""), _memory(tmp_path, "quantization_bit: 4\n")
    by = lambda v: {(p["stage"], p["offload"]): p["gpu_GiB"] for p in v.metrics["plans"]}  # noqa: E731
    assert by(lora)[(0, "none")] - by(qlora)[(0, "none")] == pytest.approx((13.48e9 - 3.87e9 - 0.09e9) / 2**30, rel=0.03)
    assert qlora.metrics["base_weights_GiB"] == pytest.approx(3.87e9 / 2**30, rel=0.02)
    assert any("bnb 4-bit (double quant)" in d for d in qlora.details)
