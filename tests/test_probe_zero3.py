"""zero3.model and config.zero3_guards. The slow tests run the real probe: two gloo ranks on
this CPU, DeepSpeed ZeRO-3 with zero.Init, on tiny configs of architectures transformers ships
(written here with save_pretrained: config.json only, never weights), on models shipped as remote
code with a ZeRO-3-hostile line planted, and on MoE blocks in the pre-transformers-5 layout.
The fast tests cover LLaMA-Factory's guards (the shrinking and the DeepSpeed "auto" filling:
tests/test_workers_shrink.py)."""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from mgft_doctor.check.context import Context, Options
from mgft_doctor.check.facts import Facts
from mgft_doctor.check.probe import Status
from mgft_doctor.probes import _codes, config_zero3_guards, zero3_model
from mgft_doctor.check.runner import run_probe as run_checked  # applies(), run(), the stamped result

FIXTURES = Path(__file__).parent / "fixtures" / "remote_code"
TIMINGS: dict[str, float] = {}


def leftover_workers():
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=False).stdout
    return [ln for ln in out.splitlines() if "probes/workers/zero3_model" in ln and "ps -eo" not in ln]


def save_config(tmp_path: Path, name: str, config) -> Path:
    folder = tmp_path / name
    config.save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    return folder


def remote_model(tmp_path: Path, name: str, **overrides) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for f in FIXTURES.glob("*.py"):
        shutil.copy(f, folder / f.name)
    cfg = {"model_type": "mgft_toy", "architectures": ["MgftToyForCausalLM"],
           "auto_map": {"AutoConfig": "configuration_mgft_toy.MgftToyConfig",
                        "AutoModelForCausalLM": "modeling_mgft_toy.MgftToyForCausalLM"},
           "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_local_experts": 0, "planted": "none"}
    cfg.update(overrides)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def run_probe(tmp_path, model=None, config=None, trust=False, timeout=240.0, label=None):
    opts = Options(model=str(model) if model else None, config=str(config) if config else None, nproc=2,
                   timeout=timeout, trust_remote_code=trust, cache_dir=str(tmp_path / "cache"))
    t0 = time.monotonic()
    res = run_checked(zero3_model.PROBE, Context(opts))
    TIMINGS[label or str(model)] = round(time.monotonic() - t0, 1)
    print(f"zero3.model {label or model}: {res.status.value} in {time.monotonic() - t0:.1f} s — {res.summary}")
    assert not leftover_workers()
    return res


def codes(res):
    return [f.code for f in res.findings]


# ---- real architectures transformers ships -------------------------------------------------

def _llama():
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
                       num_key_value_heads=2, vocab_size=32000)


def _qwen2():
    from transformers import Qwen2Config
    return Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)


def _mixtral():
    from transformers import MixtralConfig
    return MixtralConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2)


def _qwen2_moe():
    from transformers import Qwen2MoeConfig
    return Qwen2MoeConfig(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                          shared_expert_intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                          num_key_value_heads=8, num_experts=60, num_experts_per_tok=4)


def _gemma2():
    from transformers import Gemma2Config
    return Gemma2Config(hidden_size=576, intermediate_size=2304, num_hidden_layers=6, num_attention_heads=8,
                        num_key_value_heads=4, head_dim=256)


def _phi3():
    from transformers import Phi3Config
    return Phi3Config(hidden_size=768, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=12,
                      num_key_value_heads=12)


ARCHITECTURES = {"llama": (_llama, False), "qwen2": (_qwen2, False), "mixtral": (_mixtral, True),
                 "qwen2_moe": (_qwen2_moe, True), "gemma2": (_gemma2, False), "phi3": (_phi3, False)}


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_real_architecture_trains_saves_reloads(tmp_path, arch):
    make, moe = ARCHITECTURES[arch]
    folder = save_config(tmp_path, arch, make())
    res = run_probe(tmp_path, folder, label=arch)
    assert res.status is Status.PASS, (res.summary, res.findings, res.details[-30:])
    m = res.metrics
    assert m["model_type"] == arch and m["zero_stage"] == 3 and m["backend"] == "gloo" and m["world_size"] == 2
    assert len(m["losses"]) == 2  # two optimizer steps, accumulation 1
    assert "16-bit save + reload identical" in res.summary and "zero.Init" in res.summary
    assert any("parameters partitioned" in d for d in res.details)
    if moe:
        # transformers 5 keeps all experts of a layer in one module: the ranks stay in step
        # even without leaf modules; the run says so instead of guessing
        assert "MoE without leaf modules: no hang" in res.summary, res.summary
        assert any("rank 0: [0, 1]" in d and "rank 1: [0, 1, 2, 3]" in d for d in res.details), res.details
    else:
        assert not any("MoE" in d for d in res.details)
    assert m["wall_s"] < 120  # target: under 60 s warm on an idle machine


@pytest.mark.slow
def test_local_tokenizer_keeps_the_vocabulary(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["the doctor trains a tiny copy of the model under ZeRO-3 " * 20],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder = tmp_path / "llama_tok"
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(folder)
    LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=4, vocab_size=1000, bos_token_id=1, eos_token_id=2).save_pretrained(folder)
    res = run_probe(tmp_path, folder, label="llama + local tokenizer")
    assert res.status is Status.PASS, (res.summary, res.details[-20:])
    assert any("vocabulary 1000" in d for d in res.details)  # kept, not shrunk to 512
    assert any("used for the inputs" in d for d in res.details)


@pytest.mark.slow
def test_save_without_gathering_and_accumulation_from_the_yaml(tmp_path):
    folder = save_config(tmp_path, "llama", _llama())
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
          "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                "stage3_param_persistence_threshold": "auto",
                                "stage3_gather_16bit_weights_on_model_save": False}}
    (tmp_path / "ds_z3.json").write_text(json.dumps(ds))
    (tmp_path / "train.yaml").write_text(
        f"model_name_or_path: {folder}\nstage: sft\nfinetuning_type: full\ndeepspeed: {tmp_path / 'ds_z3.json'}\n"
        "gradient_accumulation_steps: 3\nlearning_rate: 1.0e-5\n")
    res = run_probe(tmp_path, config=tmp_path / "train.yaml", label="llama, gather off, accumulation 3")
    assert res.status is Status.FAIL
    assert codes(res) == [_codes.ZERO3_EMPTY_SAVE]
    f = res.findings[0]
    assert "saved nothing" in f.message and "torch.Size([0])" in f.message
    assert "stage3_gather_16bit_weights_on_model_save" in f.fix and "zero_to_fp32" in f.fix
    assert res.metrics["accumulation"] == 3 and len(res.metrics["losses"]) == 6  # 2 steps x 3 micro-batches
    assert "(accumulation 3)" in res.summary


@pytest.mark.slow
@pytest.mark.parametrize("planted, step, function", [("init_reads_weight", "zero_init", "__init__"),
                                                     ("forward_reads_cached_weight", "step_1", "forward")])
def test_planted_zero3_hostile_model_code(tmp_path, planted, step, function):
    folder = remote_model(tmp_path, "hostile", planted=planted)
    res = run_probe(tmp_path, folder, trust=True, label=f"hostile: {planted}")
    assert res.status is Status.FAIL
    assert codes(res) == [_codes.ZERO3_MODEL_CODE], res.findings
    f = res.findings[0]
    assert "modeling_mgft_toy.py:" in f.message and f"in {function}" in f.message  # the failing frame
    assert "the same code runs without DeepSpeed" in f.message
    assert "GatheredParameters" in f.fix
    assert f"({step})" in res.summary


@pytest.mark.slow
def test_remote_code_needs_the_flag(tmp_path):
    folder = remote_model(tmp_path, "custom")
    res = run_probe(tmp_path, folder, trust=False, label="remote code without the flag")
    assert res.status is Status.SKIP
    assert "--trust-remote-code" in res.summary and res.summary.startswith("skipped:")
    assert not (tmp_path / "cache" / "hf_modules").exists() or not any((tmp_path / "cache" / "hf_modules").rglob("modeling_mgft_toy.py"))


@pytest.mark.slow
def test_moe_block_that_is_not_a_leaf_module(tmp_path):
    """Experts as a ModuleList, only the experts that got tokens run (the layout of Mixtral before
    transformers 5, and of most remote-code MoE models): without leaf modules, ranks that route
    to different experts issue different all-gathers. On gloo that is a collective mismatch
    (the rank aborts at once); on NCCL it is the hang that ends at the watchdog."""
    folder = remote_model(tmp_path, "legacy_moe", num_local_experts=8, num_experts_per_tok=2)
    res = run_probe(tmp_path, folder, trust=True, label="remote-code MoE, experts as ModuleList")
    assert res.status is Status.FAIL, res.summary
    assert codes(res) == [_codes.ZERO3_MOE_LEAF]
    f = res.findings[0]
    assert "ToySparseMoeBlock" in f.message and "not a ZeRO-3 leaf module" in f.message
    assert "desynchronised" in f.message or "hung" in f.message
    assert '"leaf_module": {"classes": ["ToySparseMoeBlock"]}' in f.fix and "set_z3_leaf_modules" in f.fix
    # the run with the block as a leaf module passed: train, save, reload
    assert "16-bit save + reload identical" in res.summary
    assert any("as ZeRO-3 leaf modules the same routing trained" in d for d in res.details)


def test_no_model_no_run(tmp_path):
    res = run_checked(zero3_model.PROBE, Context(Options(cache_dir=str(tmp_path))))
    assert res.status is Status.SKIP and "--model" in res.summary
    (tmp_path / "t.yaml").write_text("stage: sft\n")
    res = run_checked(zero3_model.PROBE, Context(Options(config=str(tmp_path / "t.yaml"), cache_dir=str(tmp_path))))
    assert res.status is Status.SKIP and "model_name_or_path" in res.summary


@pytest.mark.slow
def test_check_cli_json_and_exit_code(run_check, tmp_path):
    folder = remote_model(tmp_path, "legacy_moe", num_local_experts=4, num_experts_per_tok=2,
                          planted="init_reads_weight")
    code, probes, err = run_check("--only", "zero3", "--model", str(folder), "--trust-remote-code")
    p = probes["zero3.model"]
    assert code == 1 and p["status"] == "fail", err[-2000:]
    assert p["findings"][0]["code"] == _codes.ZERO3_MODEL_CODE
    assert p["metrics"]["backend"] == "gloo"
    assert not leftover_workers()


# ---- quantized checkpoints and LLaMA-Factory's guards (no processes) ------------------------

@pytest.mark.parametrize("qc, refused", [({"quant_method": "gptq", "bits": 4}, True),
                                         ({"quant_method": "awq", "bits": 4}, True),
                                         ({"quant_method": "bitsandbytes", "load_in_4bit": True}, True),
                                         ({"quant_method": "fp8"}, False), ({"quant_method": "mxfp4"}, False)])
def test_prequantized_checkpoint_under_zero3(qc, refused):
    findings, notes = zero3_model.quantization_findings({"model_type": "llama", "quantization_config": qc}, 3)
    assert [f.code for f in findings] == ([_codes.ZERO3_QUANTIZED] if refused else [])
    if refused:
        assert "PTQ-quantized" in findings[0].message and "ZeRO-2" in findings[0].fix
    else:
        assert "de-quantizes" in notes[0]
    assert zero3_model.quantization_findings({"quantization_config": qc}, 2)[0] == []


def test_llamafactory_guards():
    g = config_zero3_guards.guards
    y = {"predict_with_generate": True, "pure_bf16": True, "use_unsloth": True, "quantization_bit": 8,
         "pissa_init": True, "use_kt": True}
    got = [f.code for f in g(y, zero3=True, deepspeed=True, distributed=True)]
    assert got == [_codes.LF_ZERO3_GUARD] * 3 + [_codes.ZERO3_UNSLOTH, _codes.LF_ZERO3_GUARD, _codes.ZERO3_QUANTIZED]
    assert g(y, zero3=False, deepspeed=True, distributed=True) == []
    assert g({"quantization_bit": 4}, zero3=True, deepspeed=True, distributed=True) == []  # QLoRA + ZeRO-3 works
    assert [f.code for f in g({"quantization_bit": 4, "quantization_method": "hqq"}, True, True, True)] == [_codes.ZERO3_QUANTIZED]
    assert [f.code for f in g({"use_galore": True}, False, True, True)] == [_codes.LF_OPTIMIZER_GUARD]
    assert [f.code for f in g({"use_badam": True}, False, True, True)] == [_codes.LF_OPTIMIZER_GUARD]
    assert g({"use_badam": True}, True, True, True) == []  # layer-wise BAdam is LLaMA-Factory's ZeRO-3 recipe


def test_guards_probe_on_llamafactory_examples(tmp_path):
    examples = Path("/work/shared/llamafactory-examples")
    if not examples.exists():
        pytest.skip("LLaMA-Factory examples not available")
    ds = examples / "deepspeed" / "ds_z3_config.json"
    y = tmp_path / "t.yaml"
    y.write_text(f"model_name_or_path: x/y\nstage: sft\nfinetuning_type: lora\ndeepspeed: {ds}\npure_bf16: true\n")
    res = config_zero3_guards.run(Context(Options(config=str(y), nproc=2, cache_dir=str(tmp_path))))
    assert res.status is Status.FAIL and [f.code for f in res.findings] == [_codes.LF_ZERO3_GUARD]
    y.write_text(f"model_name_or_path: x/y\nstage: sft\nfinetuning_type: lora\ndeepspeed: {ds}\nquantization_bit: 4\n")
    res = config_zero3_guards.run(Context(Options(config=str(y), nproc=2, cache_dir=str(tmp_path))))
    assert res.status is Status.PASS


def teardown_module(module):
    if TIMINGS:
        print("\nzero3.model wall times:", json.dumps(TIMINGS))


def test_the_stand_in_gloo_run_of_a_gpu_host_skips_deepspeeds_shm_op(monkeypatch):
    """On a GPU host the gloo run gets skip_shm_op (its init_distributed would JIT-build DeepSpeed's
    CPU shm all-reduce, which the NCCL run never uses); on a machine without GPUs it keeps it."""
    seen = []

    def fake_launch(script, **kw):
        seen.append((kw["args"], kw["env"]))
        raise RuntimeError("stop here")

    monkeypatch.setattr(zero3_model, "launch", fake_launch)
    for devices, want in ((1, True), (0, False)):
        ctx = Context(Options())
        ctx.__dict__["facts"] = Facts({"device_count": devices, "nccl_available": True, "devices": []})
        with pytest.raises(RuntimeError):
            zero3_model._run_once(ctx, "gloo", 2, {"model_type": "llama"}, {"moe_check": False}, {}, "m", [], [])
        args, env = seen[-1]
        assert args["skip_shm_op"] is want and env["DS_ACCELERATOR"] == "cpu"


@pytest.mark.slow
def test_init_distributed_with_skip_shm_op_builds_nothing(tmp_path):
    """The worker's init_distributed on two gloo ranks (DS_ACCELERATOR=cpu) with skip_shm_op and an
    empty extensions folder: DeepSpeed's init returns in well under the seconds a build takes, and
    nothing is built; the folder is the one tagged for this Python/torch/DeepSpeed/accelerator."""
    import os
    import sys

    from mgft_doctor.launch import workers_dir

    script = tmp_path / "init.py"
    script.write_text(f"""
import os, sys, time, json
sys.path.insert(0, {str(workers_dir())!r})
import zero3_model as z
class W: local_rank = int(os.environ["LOCAL_RANK"])
class R: a = {{"skip_shm_op": True, "backend": "gloo", "pg_timeout": 60}}; on_gpu = False; w = W()
t0 = time.perf_counter()
z.init_distributed(R())
import torch.distributed as dist
dist.barrier()
print(json.dumps({{"init_s": time.perf_counter() - t0, "ext": os.environ["TORCH_EXTENSIONS_DIR"]}}), flush=True)
""")
    from mgft_doctor.launch.processes import free_port

    env = dict(os.environ, DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                          "127.0.0.1", "--master_port", str(free_port()), str(script)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and all(r["init_s"] < 20 for r in rows), rows
    assert all("_cpu_" in os.path.basename(r["ext"]) and "_torch" in r["ext"] for r in rows)
    assert not any((tmp_path / "ext").rglob("deepspeed_shm_comm*"))
