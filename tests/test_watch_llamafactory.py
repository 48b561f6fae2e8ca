"""A real LLaMA-Factory SFT through `mgft-doctor run` (FORCE_TORCHRUN=1, two CPU ranks, a tiny
LLaMA with a local BPE tokenizer and dataset made here) behaves as it does without the doctor:
exit 0 and the same closing lines (the train metrics), nothing added on our side."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_watch_runs import find_tool

pytestmark = pytest.mark.slow
DOCTOR = [sys.executable, "-m", "mgft_doctor"]

BUILD = r'''
import json, os, random, sys
import torch, transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

out = sys.argv[1]
words = "the a of to in is model data train step loss rank node gpu batch token text answer question why how".split()
rng = random.Random(0)
say = lambda lo=4, hi=10: " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator([say() for _ in range(500)], trainer=trainers.BpeTrainer(
    vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
fast.save_pretrained(os.path.join(out, "model"))
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=len(fast), max_position_embeddings=256)
transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(os.path.join(out, "model"))
os.makedirs(os.path.join(out, "data"), exist_ok=True)
rows = [{"instruction": say(), "input": "", "output": say()} for _ in range(16)]
json.dump(rows, open(os.path.join(out, "data", "tiny.json"), "w"))
json.dump({"tiny": {"file_name": "tiny.json"}}, open(os.path.join(out, "data", "dataset_info.json"), "w"))
'''

YAML = """\
model_name_or_path: model
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 4
lora_target: all
dataset: tiny
dataset_dir: data
template: qwen
cutoff_len: 64
overwrite_cache: true
preprocessing_num_workers: 1
output_dir: {out}
overwrite_output_dir: true
logging_steps: 1
max_steps: 3
per_device_train_batch_size: 1
learning_rate: 1.0e-4
report_to: none
save_strategy: "no"
ddp_timeout: 180
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lf")
    subprocess.run([sys.executable, "-c", BUILD, str(folder)], check=True, timeout=300,
                   env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    return folder


def _env(folder: Path) -> dict:
    from mgft_doctor.launch.processes import free_port
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MGFT_DOCTOR_", "PYTEST_"))}
    bindir = str(Path(find_tool("llamafactory-cli")).parent)
    env.update(PATH=bindir + os.pathsep + env.get("PATH", ""), FORCE_TORCHRUN="1", NPROC_PER_NODE="2",
               NNODES="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), CUDA_VISIBLE_DEVICES="",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(folder / ".hf"), OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", XDG_CACHE_HOME=str(folder / "cache"), DISABLE_VERSION_CHECK="1")
    return env


def _metrics(text: str) -> list[str]:
    """The train metrics block LLaMA-Factory ends with, numbers left out."""
    block = text[text.rfind("***** train metrics *****"):]
    return sorted(set(re.findall(r"^\s*(\w+)\s+=", block, re.M)))


def test_llamafactory_sft_through_run_is_the_same_as_without(workdir):
    (workdir / "plain.yaml").write_text(YAML.format(out="out_plain"))
    (workdir / "run.yaml").write_text(YAML.format(out="out_run"))
    cli = find_tool("llamafactory-cli")
    plain = subprocess.run([cli, "train", "plain.yaml"], cwd=workdir, env=_env(workdir), capture_output=True,
                           text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    ours = subprocess.run(DOCTOR + ["run", "--", cli, "train", "run.yaml"], cwd=workdir, env=_env(workdir),
                          capture_output=True, text=True, timeout=600)
    assert ours.returncode == 0, ours.stderr[-3000:]
    both_plain, both_ours = plain.stdout + plain.stderr, ours.stdout + ours.stderr
    assert _metrics(both_plain) and _metrics(both_ours) == _metrics(both_plain)
    assert "train_loss" in _metrics(both_ours)
    assert [l for l in ours.stderr.splitlines() if l.startswith("mgft-doctor:")] == ours.stderr.splitlines()[:2]
    assert "Warning: Environment variable" not in both_ours  # the instrumentation adds no warning
    assert (workdir / "out_run" / "adapter_model.safetensors").exists()
    folder = Path(re.search(r"dumps in (\S+)\)", ours.stderr).group(1))
    regs = [json.loads(p.read_text()) for p in (folder / "procs").glob("*.json")]
    assert sorted(r["rank"] for r in regs if r["role"] == "rank") == ["0", "1"]  # both ranks were instrumented
