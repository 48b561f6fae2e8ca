"""rehearsal.run: the user's YAML in miniature through the real llamafactory-cli train.

Fast tests: the miniature's parts (datasets, YAML, DeepSpeed JSON, the ranks' sitecustomize, the
safetensors reader, the verdict on a log) on plain inputs. Slow tests (`-m slow`): real
rehearsals on two gloo ranks — a LoRA SFT under LLaMA-Factory's own ZeRO-3 JSON passes and
leaves the user's folders as they were; planted faults that LLaMA-Factory only hits after start
fail with their catalog codes; LLaMA-Factory's example YAMLs (hub models swapped for a local
config.json of the same family) rehearse with the outcomes docs/rehearsal.md records."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mgft_doctor.check.context import Context, Options
from mgft_doctor.launch import worker_script
from mgft_doctor.launch.processes import TOKEN_VAR
from mgft_doctor.probes import rehearsal_run
from mgft_doctor.probes.workers import _mini_config, _mini_data, _peaks_site

EXAMPLES = Path("/work/shared/llamafactory-examples")
Z3 = EXAMPLES / "deepspeed" / "ds_z3_config.json"
TIMINGS: dict[str, float] = {}

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
         "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
         "initializer_range": 0.02, "intermediate_size": 9728, "max_position_embeddings": 262144,
         "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
         "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000,
         "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
         "use_sliding_window": False, "vocab_size": 151936}
LLAMA3 = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
          "bos_token_id": 128000, "eos_token_id": 128009, "hidden_act": "silu", "hidden_size": 4096,
          "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama",
          "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
          "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16", "vocab_size": 128256}
QWEN3_VL = {"architectures": ["Qwen3VLForConditionalGeneration"], "image_token_id": 151655, "model_type": "qwen3_vl",
            "text_config": {**{k: v for k, v in QWEN3.items() if k not in ("architectures", "torch_dtype")},
                            "model_type": "qwen3_vl_text", "dtype": "bfloat16",
                            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                             "rope_type": "default"}},
            "tie_word_embeddings": True, "video_token_id": 151656, "vision_end_token_id": 151653,
            "vision_start_token_id": 151652,
            "vision_config": {"deepstack_visual_indexes": [5, 11, 17], "depth": 24, "hidden_act": "gelu_pytorch_tanh",
                              "hidden_size": 1024, "in_channels": 3, "initializer_range": 0.02,
                              "intermediate_size": 4096, "model_type": "qwen3_vl", "num_heads": 16,
                              "num_position_embeddings": 2304, "out_hidden_size": 2560, "patch_size": 16,
                              "spatial_merge_size": 2, "temporal_patch_size": 2}}
PREQUANTIZED = {"gptq": {"bits": 4, "group_size": 128, "quant_method": "gptq", "desc_act": False, "sym": True},
                "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
                "aqlm": {"quant_method": "aqlm", "in_group_size": 8, "nbits_per_codebook": 16, "num_codebooks": 1,
                         "out_group_size": 1}}

TOKENIZER = r'''
import os, random, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
words = "the a of to in is model data train step loss rank node batch token text answer question".split()
rng = random.Random(0)
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator([" ".join(rng.choice(words) for _ in range(8)) for _ in range(300)],
    trainer=trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>").save_pretrained(sys.argv[1])
'''


# ---- fast: datasets --------------------------------------------------------------------------------

def test_dataset_names_split_as_llamafactory_splits_them():
    assert _mini_data.dataset_names("identity, alpaca_en_demo") == ["identity", "alpaca_en_demo"]
    assert _mini_data.dataset_names(["a", " b "]) == ["a", "b"]
    assert _mini_data.dataset_names(None) == []


def test_head_of_a_large_json_list_is_read_without_the_rest(tmp_path):
    rows = [{"instruction": "q" * 5000 + str(i), "input": "", "output": "a"} for i in range(200)]
    (tmp_path / "big.json").write_text(json.dumps(rows, indent=2))
    assert _mini_data.head_rows(str(tmp_path / "big.json"), 16) == rows[:16]
    (tmp_path / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _mini_data.head_rows(str(tmp_path / "big.jsonl"), 3) == rows[:3]
    (tmp_path / "t.csv").write_text("instruction,output\nq1,a1\nq2,a2\n")
    assert _mini_data.head_rows(str(tmp_path / "t.csv"), 1) == [{"instruction": "q1", "output": "a1"}]


def test_head_of_a_parquet_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"text": f"t{i}"} for i in range(50)]), tmp_path / "d.parquet")
    assert _mini_data.head_rows(str(tmp_path / "d.parquet"), 4) == [{"text": f"t{i}"} for i in range(4)]


def test_synthetic_rows_follow_the_declared_columns_and_tags():
    alpaca = _mini_data.synthetic_rows({}, 2)
    assert set(alpaca[0]) == {"instruction", "input", "output"}
    pt = _mini_data.synthetic_rows({"columns": {"prompt": "text"}}, 1)[0]
    assert set(pt) == {"text"}  # with `columns`, LLaMA-Factory reads only the columns named
    ranking = _mini_data.synthetic_rows({"ranking": True, "columns": {"prompt": "q", "chosen": "good",
                                                                       "rejected": "bad"}}, 1)[0]
    assert set(ranking) == {"q", "good", "bad"}
    kto = _mini_data.synthetic_rows(_mini_data.STAGE_DEFAULTS["kto"], 2)
    assert [r["label"] for r in kto] == [True, False]
    assert [m["role"] for m in kto[0]["messages"]] == ["user", "assistant"]
    share = _mini_data.synthetic_rows({"formatting": "sharegpt", "ranking": True,
                                       "columns": {"messages": "conversations", "chosen": "chosen",
                                                   "rejected": "rejected"}}, 1)[0]
    assert share["conversations"][0]["from"] == "human" and share["chosen"]["from"] == "gpt"


def test_plan_dataset_copies_local_files_and_synthesises_the_rest(tmp_path):
    (tmp_path / "mine.json").write_text(json.dumps([{"q": "x", "a": "y"}] * 30))
    info = {"mine": {"file_name": "mine.json", "columns": {"prompt": "q", "response": "a"}},
            "hub": {"hf_hub_url": "org/set", "formatting": "sharegpt", "columns": {"messages": "msgs", "images": "img"}},
            "gone": {"file_name": "missing.json"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    out = tmp_path / "mini"
    out.mkdir()
    before = _tree_hash(tmp_path, skip="mini")
    mini, notes = _mini_data.build_datasets(["mine", "hub", "gone", "unknown"], str(tmp_path), "sft", str(out), n=5)
    assert _tree_hash(tmp_path, skip="mini") == before  # the user's folder is only read
    assert json.loads((out / "mine.json").read_text()) == [{"q": "x", "a": "y"}] * 5
    assert mini["mine"]["columns"] == info["mine"]["columns"]
    assert "images" not in mini["hub"]["columns"] and "hf_hub_url" not in mini["hub"]
    assert set(json.loads((out / "hub.json").read_text())[0]) == {"msgs"}
    assert mini["unknown"] == {"file_name": "unknown.json"}
    assert json.loads((out / "dataset_info.json").read_text()) == mini
    assert any("media columns left out: images" in n for n in notes) and any("not found" in n for n in notes)


# ---- fast: YAML and DeepSpeed JSON -----------------------------------------------------------------

def _example(name: str) -> dict:
    if not EXAMPLES.exists():
        pytest.skip("LLaMA-Factory examples not available")
    return yaml.safe_load((EXAMPLES / name).read_text())


def test_mini_yaml_keeps_the_run_and_changes_only_what_a_miniature_must():
    user = _example("train_lora/qwen3_lora_sft_ds3.yaml")
    y, notes = _mini_config.mini_yaml(user, model_dir="/r/model", data_dir="/r/data", out_dir="/r", ds={},
                                      ds_path="/r/ds.json", on_gpu=False, bf16_ok=False, quantization_ok=False)
    for key in ("stage", "finetuning_type", "lora_rank", "lora_target", "template", "gradient_accumulation_steps",
                "learning_rate", "lr_scheduler_type", "warmup_ratio"):
        assert y[key] == user[key], key
    assert (y["model_name_or_path"], y["dataset_dir"], y["output_dir"], y["deepspeed"]) == (
        "/r/model", "/r/data", "/r/out", "/r/ds.json")
    assert (y["max_steps"], y["save_steps"], y["cutoff_len"], y["bf16"]) == (3, 3, 128, False)
    assert "resume_from_checkpoint" not in y and y["preprocessing_num_workers"] == 1
    assert any(n.startswith("bf16 dropped on the CPU") for n in notes)
    y, _ = _mini_config.mini_yaml(user, model_dir="m", data_dir="d", out_dir="o", ds={}, ds_path="x",
                                  on_gpu=True, bf16_ok=True, quantization_ok=True)
    assert y["bf16"] is True  # the GPU rehearsal keeps the precision


def test_mini_yaml_on_cpu_without_deepspeed_keeps_bf16_with_use_cpu_where_the_cpu_has_it():
    y, notes = _mini_config.mini_yaml({"bf16": True}, model_dir="m", data_dir=None, out_dir="o", ds=None,
                                      ds_path=None, on_gpu=False, bf16_ok=True, quantization_ok=True)
    assert y["bf16"] is True and y["use_cpu"] is True and "deepspeed" not in y


def test_mini_yaml_caps_the_batch_unless_deepspeed_states_it_in_numbers():
    user = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 32}
    y, _ = _mini_config.mini_yaml(user, model_dir="m", data_dir=None, out_dir="o", ds={"train_batch_size": "auto"},
                                  ds_path="x", on_gpu=True, bf16_ok=True, quantization_ok=True)
    assert (y["per_device_train_batch_size"], y["gradient_accumulation_steps"]) == (2, 8)
    y, notes = _mini_config.mini_yaml(user, model_dir="m", data_dir=None, out_dir="o",
                                      ds={"gradient_accumulation_steps": 32}, ds_path="x", on_gpu=True, bf16_ok=True,
                                      quantization_ok=True)
    assert (y["per_device_train_batch_size"], y["gradient_accumulation_steps"]) == (8, 32)
    assert any("kept (the DeepSpeed config sets" in n for n in notes)


def test_mini_yaml_drops_what_points_at_the_users_files_and_quantization_without_backend():
    user = {"adapter_name_or_path": "/u/adapter", "tokenized_path": "/u/tok", "push_to_hub": True, "val_size": 0.1,
            "quantization_bit": 4, "quantization_method": "bnb", "ray_num_workers": 4, "eval_strategy": "steps"}
    y, notes = _mini_config.mini_yaml(user, model_dir="m", data_dir=None, out_dir="/r", ds=None, ds_path=None,
                                      on_gpu=False, bf16_ok=False, quantization_ok=False)
    assert y["tokenized_path"] == "/r/tokenized" and y["eval_strategy"] == "no"
    for key in ("adapter_name_or_path", "push_to_hub", "val_size", "quantization_bit", "ray_num_workers"):
        assert key not in y, key
    assert any(n.startswith("quantization_bit 4 (bnb) dropped") for n in notes)


def test_mini_ds_config_keeps_the_sections_and_moves_what_writes_outside():
    ds = json.loads(Z3.read_text()) if Z3.exists() else {"zero_optimization": {"stage": 3}}
    ds = copy.deepcopy(ds)
    ds["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": "/u/nvme", "pin_memory": True}
    ds["tensorboard"] = {"enabled": True, "output_path": "/u/tb"}
    ds["optimizer"] = {"type": "AdamW", "params": {"lr": "auto"}}
    ds["bf16"] = {"enabled": True}
    cfg, notes = _mini_config.mini_ds_config(ds, yaml={"bf16": False}, on_gpu=False, scratch_dir="/r")
    z = cfg["zero_optimization"]
    assert z["stage"] == 3 and z["offload_param"]["nvme_path"] == "/r/nvme" and not z["offload_param"]["pin_memory"]
    assert "tensorboard" not in cfg and "optimizer" not in cfg and cfg["bf16"]["enabled"] is False
    gpu, _ = _mini_config.mini_ds_config(ds, yaml={}, on_gpu=True, scratch_dir="/r")
    assert gpu["optimizer"] == ds["optimizer"] and gpu["bf16"] == {"enabled": True}


# ---- fast: the ranks' sitecustomize, the saved weights, the verdict ---------------------------------

def test_sitecustomize_records_each_ranks_peak_and_the_token(tmp_path):
    site, peaks = tmp_path / "site", tmp_path / "peaks"
    site.mkdir()
    peaks.mkdir()
    (site / "sitecustomize.py").write_text(Path(worker_script("_peaks_site")).read_text())
    env = dict(os.environ, PYTHONPATH=str(site), MGFT_DOCTOR_PEAKS=str(peaks), RANK="1", LOCAL_RANK="1",
               **{TOKEN_VAR: "tok123"})
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'x = bytearray(50_000_000)'], check=True)"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    recs = [json.loads(p.read_text()) for p in peaks.glob("peak-rank*.json")]
    assert len(recs) == 1  # the rank, not its child (it inherits the rank's variables)
    assert recs[0]["rank"] == 1 and recs[0]["token"] == "tok123" and recs[0]["max_rss_bytes"] > 5_000_000
    subprocess.run([sys.executable, "-c", "pass"], env={**env, "LOCAL_RANK": ""}, check=True, timeout=60)
    assert len(list(peaks.glob("*.json"))) == 1  # not a rank: nothing written
    assert _peaks_site.TOKEN_VAR == TOKEN_VAR


def test_safetensors_header_counts_empty_tensors(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
              "b": {"dtype": "F32", "shape": [0], "data_offsets": [16, 16]}, "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    (tmp_path / "m.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 16)
    assert rehearsal_run.safetensors_tensors(str(tmp_path / "m.safetensors")) == (2, 1)


def test_a_failed_rehearsals_log_gets_explains_code_or_the_root_error():
    log = ("[rank0]: Traceback (most recent call last):\n"
           '[rank0]:   File "/x/site-packages/transformers/training_args.py", line 1738, in _validate_args\n'
           "[rank0]: ValueError: Your setup doesn't support bf16/gpu. You need to assign use_cpu if you want "
           "to train the model on CPU.\n")
    finding, _ = rehearsal_run.failure_finding(log, 1)
    assert finding.code == "MGD805" and "the rehearsal failed" in finding.message
    odd = "Traceback (most recent call last):\n  File \"/home/u/x.py\", line 3, in f\nZeroDivisionError: nope 42\n"
    finding, _ = rehearsal_run.failure_finding(odd, 1)
    assert finding.code == "MGD113" and "ZeroDivisionError: nope 42" in finding.message


def test_applies_only_when_asked_and_for_a_stage_it_can_rehearse(tmp_path):
    y = tmp_path / "t.yaml"
    y.write_text("model_name_or_path: /nowhere\nstage: sft\n")
    assert "--rehearse" in rehearsal_run.applies(Context(Options(config=str(y))))
    y.write_text("model_name_or_path: /nowhere\nstage: ppo\n")
    assert "stage ppo is not rehearsed" in rehearsal_run.applies(Context(Options(config=str(y), rehearse=True)))
    y.write_text("model_name_or_path: /nowhere\nstage: sft\n")
    assert "config.json" in rehearsal_run.applies(Context(Options(config=str(y), rehearse=True)))


def test_the_cli_flag_reaches_the_options(run_doctor, tmp_path):
    y = tmp_path / "t.yaml"
    y.write_text("model_name_or_path: /nowhere\nstage: sft\n")
    code, out, err = run_doctor("check", str(y), "--list")
    assert code == 0 and "not asked for: add --rehearse" in out
    code, out, err = run_doctor("check", str(y), "--list", "--rehearse")
    assert code == 0 and "not asked for" not in out and "rehearsal.run" in out


# ---- slow: real rehearsals ---------------------------------------------------------------------------

def _tree_hash(folder: Path, skip: str | None = None) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if skip and rel.parts[0] == skip:
            continue
        h.update(str(rel).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A user's folder: a model folder with a Qwen3-4B config.json and a local tokenizer (no
    weights), a dataset folder with dataset_info.json and alpaca samples."""
    ws = tmp_path_factory.mktemp("user")
    model = ws / "qwen3"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3))
    subprocess.run([sys.executable, "-c", TOKENIZER, str(model)], check=True, timeout=300,
                   env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    data = ws / "data"
    data.mkdir()
    rows = [{"instruction": f"question {i} about the model", "input": "", "output": f"answer {i}"} for i in range(40)]
    (data / "tiny.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"tiny": {"file_name": "tiny.json"}}))
    return ws


def _user_yaml(ws: Path, example: str, **changes) -> Path:
    y = _example(example)
    y.update({"model_name_or_path": str(ws / "qwen3"), "dataset": "tiny", "dataset_dir": str(ws / "data"),
              "output_dir": str(ws / "saves" / "run")})
    if "deepspeed" in y:
        y["deepspeed"] = str(Z3)
    y.update(changes)
    path = ws / f"{Path(example).stem}-{len(list(ws.glob('*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(y))
    return path


def rehearse(config: Path, tmp: Path, timeout: int = 900) -> tuple[int, dict, str, float]:
    """`mgft-doctor check CONFIG --rehearse --only rehearsal --json`; (exit code, the probe, stderr, wall s)."""
    from conftest import check_json

    tmp.mkdir(parents=True, exist_ok=True)
    env = {"TMPDIR": str(tmp), "DISABLE_VERSION_CHECK": "1"}
    t0 = time.perf_counter()
    code, probes, err = check_json("check", str(config), "--rehearse", "--only", "rehearsal",
                                   "--timeout", str(timeout), env=env, timeout=timeout + 300)
    return code, probes["rehearsal.run"], err, time.perf_counter() - t0


@pytest.mark.slow
def test_lora_sft_under_llamafactorys_zero3_json_passes_and_leaves_the_users_folders_alone(workspace, tmp_path):
    config = _user_yaml(workspace, "train_lora/qwen3_lora_sft_ds3.yaml")
    before = _tree_hash(workspace)
    code, p, err, wall = rehearse(config, tmp_path / "tmp")
    TIMINGS["lora_sft_zero3"] = round(wall, 1)
    assert code == 0 and p["status"] == "pass", json.dumps(p, indent=1)[-4000:]
    assert _tree_hash(workspace) == before and not (workspace / "saves").exists()
    left = [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor_")]
    assert left == []  # the rehearsal's folder went with it (inductor's cache stays where it would be: launch)
    m = p["metrics"]
    assert m["steps"] == 3 and m["steps_per_s"] > 0 and m["world_size"] == 2 and m["backend"] == "gloo"
    assert set(m["peak_rss_bytes"]) == {"0", "1"} and min(m["peak_rss_bytes"].values()) > 100 * 2 ** 20
    assert "every rank carried the doctor's process token" in p["details"]
    assert any(d.startswith("tokenizer: yours") for d in p["details"])
    assert "ZeRO-3" in p["summary"] and "steps/s" in p["summary"]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "tmp") not in ps  # nothing of the run is left


FAULTS = {
    # a column the dataset's rows do not have: LLaMA-Factory's format conversion raises a KeyError
    "missing_column": ({"dataset": "tiny_q"}, "MGD960"),
    # a LoRA target the architecture has no module of: peft refuses at model load
    "lora_target": ({"lora_target": "c_attn"}, "MGD961"),
    # a template name LLaMA-Factory does not know: refused when the data is prepared
    "template": ({"template": "qwen4_nothink"}, "MGD927"),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["missing_column", "lora_target"])
def test_a_planted_fault_llamafactory_hits_after_start_fails_with_its_code(workspace, tmp_path, fault):
    info = json.loads((workspace / "data" / "dataset_info.json").read_text())
    if "tiny_q" not in info:
        info["tiny_q"] = {"file_name": "tiny.json", "columns": {"prompt": "question", "response": "output"}}
        (workspace / "data" / "dataset_info.json").write_text(json.dumps(info))
    changes, expected = FAULTS[fault]
    config = _user_yaml(workspace, "train_lora/qwen3_lora_sft_ds3.yaml", **changes)
    code, p, err, wall = rehearse(config, tmp_path / "tmp")
    TIMINGS[f"fault_{fault}"] = round(wall, 1)
    assert code == 1 and p["status"] == "fail", json.dumps(p, indent=1)[-4000:]
    assert [f["code"] for f in p["findings"]] == [expected], json.dumps(p["findings"], indent=1)
    assert p["findings"][0]["message"].startswith("the rehearsal failed") and p["findings"][0]["fix"]


# The example YAMLs of LLaMA-Factory 0.9.5, their hub models swapped for a local config.json of
# the same family (no tokenizer: the rehearsal builds one), everything else as shipped. The
# outcome each gets here (docs/rehearsal.md): pass, the code of the refusal the real run makes, or
# skip for a multimodal model whose folder has no processor files (the run needs them).
EXAMPLE_RUNS = {
    "train_lora/qwen3_lora_sft.yaml": (QWEN3, "pass"),
    "train_lora/qwen3_lora_sft_ds3.yaml": (QWEN3, "pass"),
    "train_lora/qwen3_lora_dpo.yaml": (QWEN3, "pass"),
    "train_lora/qwen3_lora_kto.yaml": (QWEN3, "pass"),
    "train_lora/qwen3_lora_pretrain.yaml": (QWEN3, "pass"),
    "train_lora/qwen3_lora_reward.yaml": (QWEN3, "pass"),
    "train_lora/qwen3_lora_sft_ray.yaml": (QWEN3, "pass"),
    "train_lora/qwen3_preprocess.yaml": (QWEN3, "pass"),
    "train_lora/qwen3vl_lora_sft.yaml": (QWEN3_VL, "skip"),
    "train_lora/qwen3vl_lora_dpo.yaml": (QWEN3_VL, "skip"),
    "train_full/qwen3_full_sft.yaml": (QWEN3, "pass"),
    "train_full/qwen3vl_full_sft.yaml": (QWEN3_VL, "skip"),
    "train_qlora/llama3_lora_sft_gptq.yaml": ({**LLAMA3, "quantization_config": PREQUANTIZED["gptq"]}, "pass"),
    "train_qlora/llama3_lora_sft_awq.yaml": ({**LLAMA3, "quantization_config": PREQUANTIZED["awq"]}, "pass"),
    "train_qlora/llama3_lora_sft_aqlm.yaml": ({**LLAMA3, "quantization_config": PREQUANTIZED["aqlm"]}, "pass"),
    "train_qlora/qwen3_lora_sft_otfq.yaml": (QWEN3, "pass"),
    "train_qlora/qwen3_lora_sft_bnb_npu.yaml": (QWEN3, "pass"),
    "extras/fsdp_qlora/llama3_lora_sft.yaml": (LLAMA3, "pass"),
    # refused before the extras are imported (hparams/parser.py: layer-wise GaLore under
    # distributed; layer-wise BAdam without ZeRO-3): MGD904, not the missing galore_torch/badam
    "extras/galore/llama3_full_sft.yaml": (LLAMA3, "MGD904"),
    "extras/badam/llama3_full_sft.yaml": (LLAMA3, "MGD904"),
}
CI_EXAMPLES = ("train_lora/qwen3_lora_dpo.yaml", "train_full/qwen3_full_sft.yaml",
               "train_qlora/llama3_lora_sft_gptq.yaml", "extras/galore/llama3_full_sft.yaml")
ALL_EXAMPLES = os.environ.get("MGFT_TEST_ALL_EXAMPLES") == "1"  # every example (docs/rehearsal.md's table)


@pytest.mark.slow
@pytest.mark.parametrize("example", [e if ALL_EXAMPLES or e in CI_EXAMPLES else
                                     pytest.param(e, marks=pytest.mark.skip(reason="MGFT_TEST_ALL_EXAMPLES=1 runs it"))
                                     for e in EXAMPLE_RUNS])
def test_llamafactory_examples_rehearse(example, tmp_path):
    if not EXAMPLES.exists():
        pytest.skip("LLaMA-Factory examples not available")
    cfg, expected = EXAMPLE_RUNS[example]
    model = tmp_path / "hub_model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(cfg))
    y = yaml.safe_load((EXAMPLES / example).read_text())
    y["model_name_or_path"] = str(model)
    if "deepspeed" in y:
        y["deepspeed"] = str(EXAMPLES / "deepspeed" / Path(y["deepspeed"]).name)
    y["output_dir"] = str(tmp_path / "saves")
    config = tmp_path / Path(example).name
    config.write_text(yaml.safe_dump(y))
    code, p, err, wall = rehearse(config, tmp_path / "tmp")
    TIMINGS[example] = round(wall, 1)
    got = p["status"] if p["status"] != "fail" else ",".join(f["code"] for f in p["findings"])
    print(f"\n{example}: {got} in {wall:.0f} s: {p['summary']}")
    assert got == expected, json.dumps(p, indent=1)[-5000:]
    assert not (tmp_path / "saves").exists()


def teardown_module(module):
    if TIMINGS:
        print("\nrehearsal wall times (s):", json.dumps(TIMINGS))
