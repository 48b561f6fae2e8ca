#!/usr/bin/env bash
# The doctor on the two-GPU machine (device tool), transcripts under $OUT (at most 8 files).
# usage (device machine, repo root): bash bench/gpu_session.sh
# Needs .whl/ filled by ../shared/device/wheels.sh (+ ahocorasick-rs for cp312); the doctor
# itself is installed from the working tree.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t_all=$(date +%s)
{ python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target /tmp/site . ; } \
  > /tmp/install.txt 2>&1 || { tail -20 /tmp/install.txt; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
timed() { local t0=$(date +%s.%N); "$@"; local rc=$?; echo "exit=$rc wall=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s"; }

# 1. the machine as it comes (its image sets TORCH_CUDA_ARCH_LIST=9.0a), cold JIT cache
{ echo "== environment"; nvidia-smi -L; nvidia-smi topo -m; echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-}";
  python3 -c 'import torch,deepspeed,transformers,llamafactory;print("torch",torch.__version__,"cuda",torch.version.cuda,"deepspeed",deepspeed.__version__,"transformers",transformers.__version__,"llamafactory",llamafactory.__version__)' 2>&1 | tail -1
  echo; echo '$ mgft-doctor -v        # as the image comes, cold cache'; timed mgft-doctor -v; } > "$OUT/1_check_as_image.txt" 2>&1

# 2. with a build arch DeepSpeed can parse: cold build, then warm
export TORCH_CUDA_ARCH_LIST=9.0
rm -rf ~/.cache/mgft-doctor
{ echo '$ TORCH_CUDA_ARCH_LIST=9.0 mgft-doctor --json   # cold JIT cache'; timed mgft-doctor --json > "$OUT/2_check_cold.json"; } > "$OUT/2_check_cold_time.txt" 2>&1
{ echo '$ TORCH_CUDA_ARCH_LIST=9.0 mgft-doctor -v       # warm JIT cache'; timed mgft-doctor -v;
  echo; echo '$ TORCH_CUDA_ARCH_LIST=9.0 mgft-doctor --json  # warm'; timed mgft-doctor --json > "$OUT/3_check_warm.json"; } > "$OUT/3_check_warm.txt" 2>&1

# 3. a LLaMA-Factory run: tiny Qwen2 (config only) under ZeRO-3, gradient accumulation 4
mkdir -p /tmp/run && cd /tmp/run
python3 - <<'PY'
import json, transformers
transformers.Qwen2Config(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=4096, tie_word_embeddings=True).save_pretrained("tiny-qwen2")
json.dump({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "gradient_clipping": "auto", "zero_allow_untested_optimizer": True, "bf16": {"enabled": "auto"},
           "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True,
                                 "stage3_gather_16bit_weights_on_model_save": True}}, open("ds_z3_config.json", "w"), indent=2)
open("sft_ds3.yaml", "w").write("model_name_or_path: tiny-qwen2\nstage: sft\ndo_train: true\nfinetuning_type: full\n"
  "deepspeed: ds_z3_config.json\ndataset: alpaca_en_demo\ntemplate: qwen\ncutoff_len: 2048\n"
  "per_device_train_batch_size: 1\ngradient_accumulation_steps: 4\nbf16: true\nddp_timeout: 180000000\noutput_dir: out\n")
PY
{ echo '$ cat sft_ds3.yaml'; cat sft_ds3.yaml; echo '$ mgft-doctor check sft_ds3.yaml -v --skip gpu,nccl,deepspeed,versions';
  timed mgft-doctor check sft_ds3.yaml -v --skip gpu,nccl,deepspeed,versions; } > "$OUT/4_check_yaml.txt" 2>&1
cd - > /dev/null

# 4. the pytest plugin on the sample project
cd docs/examples/pytest-gpu
{ echo '$ pytest --mgft-doctor -v -rA --junitxml=junit.xml   # docs/examples/pytest-gpu'; timed python3 -m pytest -p no:cacheprovider --mgft-doctor -v -rA --junitxml="$OUT/5_pytest_plugin_junit.xml"; } > "$OUT/5_pytest_plugin.txt" 2>&1
cd - > /dev/null
echo "total $(( $(date +%s) - t_all )) s" >> "$OUT/5_pytest_plugin.txt"
