"""The parameter count read off config.json must equal what transformers really builds, for
dense, GQA, tied and MoE architectures; the ZeRO accounting must order the stages right."""

import pytest
import torch
import transformers

from mgft_doctor.runconfig import memory as me

SMALL = dict(hidden_size=64, num_hidden_layers=3, intermediate_size=176, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1000)


def real_count(config):
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,config", [
    ("llama", transformers.LlamaConfig(**SMALL, tie_word_embeddings=False)),
    ("llama-tied", transformers.LlamaConfig(**SMALL, tie_word_embeddings=True)),
    ("mistral", transformers.MistralConfig(**SMALL)),
    ("mixtral", transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)),
    ("qwen2-moe", transformers.Qwen2MoeConfig(**SMALL, num_experts=4, moe_intermediate_size=48,
                                              shared_expert_intermediate_size=96, num_experts_per_tok=2,
                                              decoder_sparse_step=1, mlp_only_layers=[])),
])
def test_parameter_count_matches_transformers(name, config):
    shape = me.shape_from_config(config.to_dict())
    real = real_count(config)
    # biases and the shared-expert gate are left out; they are a rounding error at real sizes
    assert shape.total_params == pytest.approx(real, rel=0.02), (name, shape.total_params, real)


def test_zero_stages_order_and_offload_move_memory_to_host():
    shape = me.shape_from_config(dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=11008,
                                      num_attention_heads=32, vocab_size=32000, tie_word_embeddings=False))
    assert shape.total_params == 6_738_415_616  # Llama-2-7B's published count
    by = {(p.stage, p.offload): p for p in me.plans(shape, 8, 8, 1, 2048, None)}
    gpu = [by[k].gpu_bytes for k in [(0, "none"), (2, "none"), (3, "none"), (3, "optimizer"), (3, "optimizer+params")]]
    assert gpu == sorted(gpu, reverse=True)
    assert by[(0, "none")].gpu_bytes > 16 * shape.total_params  # 16 bytes/param before activations
    assert by[(3, "optimizer")].host_bytes > 0 and by[(3, "none")].host_bytes == 0
    lora = {(p.stage, p.offload): p for p in me.plans(shape, 8, 8, 1, 2048, 8)}
    act = me.activations(shape, 1, 2048, True, True) + me.CUDA_OVERHEAD
    # LoRA keeps the frozen base in bf16 (2 bytes/param) and trains a few million adapter weights
    assert lora[(2, "none")].gpu_bytes - act == pytest.approx(2 * shape.total_params, rel=0.02)
    # ZeRO-3: each rank's 1/8 of the base plus the gathered copies DeepSpeed keeps beside it (as large again)
    assert lora[(3, "none")].gpu_bytes - act == pytest.approx(2 * 2 * shape.total_params / 8, rel=0.05)


def test_eager_attention_costs_quadratic_memory():
    shape = me.shape_from_config(dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256))
    flash = me.activations(shape, 1, 8192, True, flash=True)
    eager = me.activations(shape, 1, 8192, True, flash=False)
    assert eager - flash == pytest.approx(5 * 32 * 8192 * 8192)  # the s×s attention scores of one layer
