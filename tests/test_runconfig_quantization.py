"""QLoRA in the run checks: the base weights config.memory counts for 4- and 8-bit quantization
(QLoRA's published 4.127 bits per NF4 weight with double quantization; the linear layers a
quantizer really replaces, counted on models transformers builds), and config.llamafactory's
backend check (bitsandbytes missing here: the real LLaMA-Factory refuses the same YAML, see
test_runconfig_lf_rules.py's bnb_missing case), including versions and devices."""

from __future__ import annotations

import json

import pytest

from mgft_doctor.check.context import Context, Options
from mgft_doctor.check.facts import Facts
from mgft_doctor.runconfig import RunConfig, codes, lf_rules, load_run_config, memory as me

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
    qlora_logits = me.activations(shape, 1, 1024, True, True, True) - me.activations(shape, 1, 1024, True, True)
    assert qlora_logits == me.QLORA_LOGIT_EXTRA * 1024 * shape.vocab  # measured on one H200 (docs/memory.md)
    assert lora[(0, "none")] - qlora[(0, "none")] == pytest.approx(
        bf16 - nf4 - me.dequant_buffer(shape, me.Quantization("bnb", 4)) - qlora_logits)
    int8_plans = {(p.stage, p.offload): p.gpu_bytes for p in me.plans(shape, 1, 1, 1, 1024, 8, quant=me.Quantization("bnb", 8))}
    assert lora[(0, "none")] - int8_plans[(0, "none")] == pytest.approx(
        bf16 - int8 - me.dequant_buffer(shape, me.Quantization("bnb", 8)))  # 8-bit was not measured: no extra


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
    logits = me.QLORA_LOGIT_EXTRA * 1 * 2048 * LLAMA_7B["vocab_size"]  # LLaMA-Factory's defaults: batch 1, cutoff_len 2048
    assert by(lora)[(0, "none")] - by(qlora)[(0, "none")] == pytest.approx(
        (13.48e9 - 3.87e9 - 0.09e9 - logits) / 2**30, rel=0.03)
    assert qlora.metrics["base_weights_GiB"] == pytest.approx(3.87e9 / 2**30, rel=0.02)
    assert any("bnb 4-bit (double quant)" in d for d in qlora.details)


def _env(**kw) -> lf_rules.Env:
    base = dict(versions={"transformers": "5.6.0", "llamafactory": "0.9.5"}, bnb_min="0.46.1")
    return lf_rules.Env(**{**base, **kw})


def _quant(tmp_path, yaml_text: str, env: lf_rules.Env, ds: dict | None = None):
    (tmp_path / "q.yaml").write_text(yaml_text)
    rc = load_run_config(str(tmp_path / "q.yaml"))
    rc.ds = ds
    return lf_rules.quantization(lf_rules.LfRun(rc, lf_rules.llamafactory_args(rc)), env)


def test_bitsandbytes_missing_old_or_without_a_device(tmp_path):
    q4 = "quantization_bit: 4\nfinetuning_type: lora\n"
    missing = _quant(tmp_path, q4, _env())
    assert [p.code for p in missing] == [codes.LF_QUANT_BACKEND] and "bitsandbytes>=0.39.0" in missing[0].message
    assert "bitsandbytes>=0.46.1" in missing[0].fix  # what transformers 5.6 asks for, above LLaMA-Factory's pin
    z3 = _quant(tmp_path, q4, _env(versions={"bitsandbytes": "0.42.0"}), ds={"zero_optimization": {"stage": 3}})
    assert "0.43.0" in z3[0].message  # LLaMA-Factory's pin for QLoRA under ZeRO-3
    old = _quant(tmp_path, q4, _env(versions={"bitsandbytes": "0.45.0"}))
    assert "requires bitsandbytes: `pip install -U bitsandbytes>=0.46.1`" in old[0].message
    ok = {"bitsandbytes": {"ok": True, "supported_devices": ["cuda"]}}
    cpu_only = _quant(tmp_path, q4, _env(versions={"bitsandbytes": "0.48.0"}, imports=ok, devices=["cpu"]))
    assert cpu_only[0].severity == "warn" and "None of the available devices" in cpu_only[0].message
    gpu = _quant(tmp_path, q4, _env(versions={"bitsandbytes": "0.48.0"}, imports=ok, devices=["cpu", "cuda"]))
    assert gpu == []
    broken = {"bitsandbytes": {"error_type": "RuntimeError", "error": "CUDA Setup failed despite GPU being available."}}
    assert "does not import" in _quant(tmp_path, q4, _env(versions={"bitsandbytes": "0.48.0"}, imports=broken))[0].message


def test_hqq_and_eetq_need_a_gpu(tmp_path):
    env = _env(versions={"hqq": "0.2.5", "eetq": "1.0.1"}, imports={"hqq": {"ok": True}, "eetq": {"ok": True}},
               devices=["cpu"])
    hqq = _quant(tmp_path, "quantization_bit: 4\nquantization_method: hqq\n", env)
    assert "HQQ model with a device_map that contains a CPU" in hqq[0].message
    eetq = _quant(tmp_path, "quantization_bit: 4\nquantization_method: eetq\n", env)
    assert "EETQ only accepts 8-bit quantization." in eetq[0].message


@pytest.mark.slow
def test_config_llamafactory_fails_a_qlora_yaml_here_without_importing_torch(tmp_path, run_check):
    """bitsandbytes is not installed in the test Python (the real LLaMA-Factory refuses this YAML:
    test_runconfig_lf_rules.py::bnb_missing): the probe says so, and its worker imported nothing."""
    (tmp_path / "q.yaml").write_text("model_name_or_path: m\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
                                     "quantization_bit: 4\ndataset: x\ndataset_dir: ONLINE\ntemplate: qwen\n"
                                     "output_dir: out\n")
    code, probes, _ = run_check("check", str(tmp_path / "q.yaml"), "--only", "config.llamafactory")
    p = probes["config.llamafactory"]
    assert code == 1 and p["status"] == "fail", p
    assert [f["code"] for f in p["findings"]] == [codes.LF_QUANT_BACKEND]
    assert p["metrics"]["worker_s"] < 5 and p["metrics"]["rules_ms"] < 500
