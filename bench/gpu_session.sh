#!/usr/bin/env bash
# Run the doctor on the two-GPU machine (device tool) and keep transcripts under $OUT.
# usage (device machine, repo root): bash bench/gpu_session.sh [part ...]   parts: env check zero3 plugin
# Needs .whl/ filled by ../shared/device/wheels.sh plus our own wheel (pip wheel --no-deps -w .whl .).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/install.txt" 2>&1 || { cat "$OUT/install.txt"; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
parts=${*:-env check}
t_all=$(date +%s)
for part in $parts; do
  case $part in
  env)
    { nvidia-smi; nvidia-smi topo -m; python3 -c 'import torch,deepspeed,transformers,llamafactory;print(torch.__version__,torch.version.cuda,deepspeed.__version__,transformers.__version__,llamafactory.__version__)'; which nvcc; nvcc --version | tail -2; df -h /dev/shm; } > "$OUT/env.txt" 2>&1
    ;;
  check)
    { echo "\$ mgft-doctor -v"; /usr/bin/time -f "wall %e s" python3 -m mgft_doctor -v; echo "exit=$?"; } > "$OUT/check_v.txt" 2>&1
    { /usr/bin/time -f "wall %e s" python3 -m mgft_doctor --json > "$OUT/check.json"; echo "exit=$?"; } > "$OUT/check_json_time.txt" 2>&1
    ;;
  esac
done
echo "total $(( $(date +%s) - t_all )) s" > "$OUT/total.txt"
