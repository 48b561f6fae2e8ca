#!/usr/bin/env bash
# The doctor on a GPU machine of the device tool, in one call; transcripts under $OUT (packed
# into one tar, since few files come back). Runs unchanged on 1, 2, 4 or 8 GPUs.
# usage (device machine, repo root): bash bench/gpu_session.sh [PARTS]   PARTS: check,planted,run,rehearse,memory (default all)
# Needs .whl/ filled by ../shared/device/wheels.sh plus ahocorasick-rs for cp312; the doctor
# itself is installed from the working tree.
set -u
OUT=${OUT:-/tmp/out}
PARTS=${1:-check,planted,run,rehearse,memory}
T=/tmp/transcripts
mkdir -p "$OUT" "$T"
# NVLink multicast stays off on these machines (KINDS.md), for the doctor and its ranks alike
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t_all=$(date +%s)
# one pip call for the wheels and the doctor: a second `pip --target` call would replace bin/ and lose
# the console scripts (llamafactory-cli, deepspeed, accelerate) the runs need
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl . > "$T/0_install.txt" 2>&1 || { tail -20 "$T/0_install.txt"; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
ls /tmp/site/bin >> "$T/0_install.txt"
timed() { local t0=$(date +%s.%N); "$@"; local rc=$?; echo "exit=$rc wall=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s"; }
want() { pack; case ",$PARTS," in *",$1,"*) return 0;; *) return 1;; esac; }
pack() { tar -C "$T" -czf "$OUT/transcripts.tgz" . 2>/dev/null; }  # after every part: a call cut short still brings back what ran
REPO=$(pwd)
ARCH_AS_IMAGE=${TORCH_CUDA_ARCH_LIST:-}

# a tiny LLaMA-Factory run: Qwen2 from a config, a local tokenizer, a local alpaca dataset
mkdir -p /tmp/run && cd /tmp/run
python3 - <<'PY' > "$T/0_setup.txt" 2>&1
import json, os, transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
cfg = transformers.Qwen2Config(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                               num_key_value_heads=4, vocab_size=4096, tie_word_embeddings=True)
words = [f"w{i}" for i in range(3000)]
tok = Tokenizer(models.BPE(unk_token="<unk>")); tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.train_from_iterator([" ".join(words[i:i + 50]) for i in range(0, 3000, 50)] * 4,
                        trainers.BpeTrainer(vocab_size=4000, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]))
fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                                            pad_token="<|endoftext|>", bos_token=None)
os.makedirs("tiny-qwen2", exist_ok=True)
fast.save_pretrained("tiny-qwen2")
cfg.vocab_size = max(4096, len(fast)); cfg.save_pretrained("tiny-qwen2")
transformers.Qwen2ForCausalLM(cfg).save_pretrained("tiny-qwen2")
os.makedirs("data", exist_ok=True)
json.dump([{"instruction": f"say w{i} w{i+1}", "input": "", "output": f"w{i+2} w{i+3} w{i+4}"} for i in range(64)],
          open("data/train.json", "w"))
json.dump({"tiny": {"file_name": "train.json"}}, open("data/dataset_info.json", "w"))
base = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "zero_allow_untested_optimizer": True, "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True,
                              "stage3_gather_16bit_weights_on_model_save": True}}
json.dump(base, open("ds_z3_config.json", "w"), indent=2)  # as LLaMA-Factory ships it: no optimizer section
json.dump(dict(base, optimizer={"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                          "weight_decay": "auto"}}), open("ds_z3_adamw.json", "w"), indent=2)
common = ("model_name_or_path: tiny-qwen2\nstage: sft\ndo_train: true\ndataset: tiny\ndataset_dir: data\ntemplate: qwen\n"
          "cutoff_len: 128\nper_device_train_batch_size: 2\ngradient_accumulation_steps: 2\nbf16: true\n"
          "max_steps: 6\nlogging_steps: 1\nsave_steps: 6\nreport_to: none\noverwrite_output_dir: true\n")
open("lora_z3.yaml", "w").write(common + "finetuning_type: lora\nlora_target: all\ndeepspeed: ds_z3_config.json\noutput_dir: out_lora\n")
open("full_z3_adamw.yaml", "w").write(common + "finetuning_type: full\ndeepspeed: ds_z3_adamw.json\noutput_dir: out_full\n")
open("lora_badtarget.yaml", "w").write(common + "finetuning_type: lora\nlora_target: no_such_proj\ndeepspeed: ds_z3_config.json\noutput_dir: out_bad\n")
print("setup ok")
PY
cd "$REPO"
R=/tmp/run

if want check; then
  { echo "== environment"; nvidia-smi -L; nvidia-smi topo -m; echo "TORCH_CUDA_ARCH_LIST=$ARCH_AS_IMAGE";
    python3 -c 'import torch,deepspeed,transformers,llamafactory;print("torch",torch.__version__,"cuda",torch.version.cuda,"deepspeed",deepspeed.__version__,"transformers",transformers.__version__,"llamafactory",llamafactory.__version__)' 2>&1 | tail -1
    echo; echo '$ mgft-doctor -v        # as the image comes (TORCH_CUDA_ARCH_LIST as exported), cold cache'; timed mgft-doctor -v; } > "$T/1_check_as_image.txt" 2>&1
  rm -rf ~/.cache/mgft-doctor
  { echo '$ TORCH_CUDA_ARCH_LIST=9.0 mgft-doctor --json   # cold JIT cache';
    TORCH_CUDA_ARCH_LIST=9.0 timed mgft-doctor --json > "$T/2_check_cold.json"; } > "$T/2_check_cold.txt" 2>&1
  { echo '$ TORCH_CUDA_ARCH_LIST=9.0 mgft-doctor -v       # warm JIT cache'; TORCH_CUDA_ARCH_LIST=9.0 timed mgft-doctor -v;
    echo '$ TORCH_CUDA_ARCH_LIST=9.0 mgft-doctor --json  # warm'; TORCH_CUDA_ARCH_LIST=9.0 timed mgft-doctor --json > "$T/3_check_warm.json"; } > "$T/3_check_warm.txt" 2>&1
  # accelerate test on the same machine, for the ratio (bench/check_wall.py reads both)
  { accelerate config default > /dev/null 2>&1; echo '$ accelerate test'; timed accelerate test; } > "$T/4_accelerate_test.txt" 2>&1
fi

if want planted; then
  {
    echo "== the run's own ops under the image's TORCH_CUDA_ARCH_LIST=$ARCH_AS_IMAGE"
    echo '$ mgft-doctor check lora_z3.yaml --only deepspeed   # ds_z3_config.json: no optimizer section'
    (cd $R && timed mgft-doctor check lora_z3.yaml --only deepspeed -v)
    echo '$ mgft-doctor check full_z3_adamw.yaml --only deepspeed   # an AdamW section: FusedAdam is JIT-built'
    (cd $R && timed mgft-doctor check full_z3_adamw.yaml --only deepspeed -v)
    echo; echo "== more ranks than GPUs"
    n=$(nvidia-smi -L | wc -l); echo "\$ mgft-doctor --only gpu,nccl --nproc $((n + 1))"
    TORCH_CUDA_ARCH_LIST=9.0 timed mgft-doctor --only gpu,nccl --nproc $((n + 1))
    echo; echo "== CUDA_VISIBLE_DEVICES naming no GPU"
    echo '$ CUDA_VISIBLE_DEVICES= mgft-doctor --only gpu,nccl'; CUDA_VISIBLE_DEVICES= timed mgft-doctor --only gpu,nccl
    echo; echo "== deepspeed missing in the examined Python"
    mkdir -p /tmp/site-nods && cp -r /tmp/site/. /tmp/site-nods/ && rm -rf /tmp/site-nods/deepspeed /tmp/site-nods/deepspeed-*
    printf '#!/bin/sh\nPYTHONPATH=/tmp/site-nods exec python3 "$@"\n' > /tmp/python-nods && chmod +x /tmp/python-nods
    echo '$ mgft-doctor --python /tmp/python-nods --only deepspeed,versions'; timed mgft-doctor --python /tmp/python-nods --only deepspeed,versions
    echo; echo "== the YAML check on this machine (one GPU: ZeRO-3 on NCCL plus a two-rank gloo pass)"
    echo '$ mgft-doctor check lora_z3.yaml -v --skip gpu,nccl,deepspeed,versions'
    (cd $R && TORCH_CUDA_ARCH_LIST=9.0 timed mgft-doctor check lora_z3.yaml -v --skip gpu,nccl,deepspeed,versions)
  } > "$T/5_planted.txt" 2>&1
fi

if want run; then
  {
    echo '$ FORCE_TORCHRUN=1 mgft-doctor run -- llamafactory-cli train lora_z3.yaml   # healthy'
    (cd $R && FORCE_TORCHRUN=1 TORCH_CUDA_ARCH_LIST=9.0 timed mgft-doctor run --log /tmp/run_healthy.log -- llamafactory-cli train lora_z3.yaml 2>&1 | tail -25)
    cat > /tmp/stall.py <<'PY'
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl"); torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.ones(1, device="cuda"); dist.all_reduce(x); print("step 1 done", flush=True)
def tokenize_the_whole_dataset_on_this_rank():
    time.sleep(3600)
if dist.get_rank() == dist.get_world_size() - 1:
    tokenize_the_whole_dataset_on_this_rank()
dist.all_reduce(x); print("never", flush=True)
PY
    n=$(nvidia-smi -L | wc -l)
    [ -n "${QUICK:-}" ] || { echo; echo "\$ mgft-doctor run --stall 20 -- torchrun --nproc_per_node $n /tmp/stall.py   # planted stall"
    timed mgft-doctor run --stall 20 --log /tmp/run_stall.log -- torchrun --nproc_per_node "$n" /tmp/stall.py 2>&1 | grep -v "^  File\|^    " | tail -40; cat ~/.cache/mgft-doctor/runs/*/stall.json 2>/dev/null | head -c 3000; }
  } > "$T/6_run.txt" 2>&1
fi

if want rehearse; then
  {
    echo '$ mgft-doctor check lora_z3.yaml --rehearse --only rehearsal -v   # LoRA SFT, passes'
    (cd $R && TORCH_CUDA_ARCH_LIST=9.0 timed mgft-doctor check lora_z3.yaml --rehearse --only rehearsal -v)
    [ -n "${QUICK:-}" ] || { echo '$ mgft-doctor check full_z3_adamw.yaml --rehearse --only rehearsal -v   # full SFT, AdamW section (image arch list: FusedAdam build)'
    (cd $R && timed mgft-doctor check full_z3_adamw.yaml --rehearse --only rehearsal -v); }
    echo '$ mgft-doctor check lora_badtarget.yaml --rehearse --only rehearsal -v   # planted: a LoRA target the model lacks'
    (cd $R && TORCH_CUDA_ARCH_LIST=9.0 timed mgft-doctor check lora_badtarget.yaml --rehearse --only rehearsal -v)
  } > "$T/7_rehearse.txt" 2>&1
fi

if want memory && [ -f bench/memory_vs_measured.py ]; then
  { echo '$ python3 bench/memory_vs_measured.py'; TORCH_CUDA_ARCH_LIST=9.0 timed python3 bench/memory_vs_measured.py --out "$T/8_memory.json"; } > "$T/8_memory.txt" 2>&1
fi

echo "total $(( $(date +%s) - t_all )) s" > "$T/total.txt"
tar -C "$T" -czf "$OUT/transcripts.tgz" .
