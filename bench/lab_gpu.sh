#!/usr/bin/env bash
# The fault lab on the one-GPU machine (device tool). Run from the repo root there:
#   bash bench/lab_gpu.sh "IDS..." "GPU_ONLY_IDS..." "SOLO_IDS..."
# IDS run once each (their fixes were verified on CPU ranks); GPU_ONLY_IDS run with --fix; SOLO_IDS
# (they take the whole GPU) run last, alone, with --fix. Needs .whl/ filled by ../shared/device/wheels.sh.
# Writes $OUT/lab-gpu.tgz (the gpu.log files and results.json) and $OUT/transcript.txt; here
# `python bench/lab.py ingest FOLDER` takes them in. CHECK_WALL=N first times `mgft-doctor check`
# against accelerate test (bench/check_wall.py, N repeats, warm cache) into $OUT/check_wall.json.
# LAB_JOBS=N runs the first list N at a time (default 5); PHASE1_S=S stops it after S seconds (what finished is kept);
# LAB_ANY=1 runs it with --any-device (CPU faults tried on the GPU).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T="$OUT/transcript.txt"
stamp() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$T"; }
stamp "machine: $(nvidia-smi -L | head -2 | tr '\n' ' ') TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-unset}"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }
notf=$(ls .whl/*.whl | grep -v -e '/transformers-' -e '/tokenizers-')
{ pipi /tmp/site .whl/*.whl > /tmp/install1.txt 2>&1 || { tail -20 /tmp/install1.txt; exit 1; }; } &
{ pipi /tmp/site-notf $notf > /tmp/install2.txt 2>&1 || { tail -20 /tmp/install2.txt; exit 1; }; } &
wait
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH LAB_SITE_NOTF=/tmp/site-notf
stamp "$(python3 -c 'import torch,deepspeed,transformers,llamafactory,accelerate;print("torch",torch.__version__,"cuda",torch.version.cuda,"deepspeed",deepspeed.__version__,"transformers",transformers.__version__,"llamafactory",llamafactory.__version__,"accelerate",accelerate.__version__)' 2>&1 | tail -1)"
pack() {
  python3 - <<'PY'
import glob, json
rows = []
for f in sorted(glob.glob("/tmp/results/[a-z].json")):
    rows += json.load(open(f))
json.dump(rows, open("/tmp/results/results.json", "w"), indent=1)
PY
  rm -rf /tmp/pack && mkdir -p /tmp/pack && cp /tmp/results/results.json /tmp/pack/
  for d in tests/lab/*/; do id=$(basename "$d"); for f in gpu.log gpu.fix.log; do [ -f "$d/$f" ] && mkdir -p /tmp/pack/$id && cp "$d/$f" /tmp/pack/$id/; done; done
  tar czf "$OUT/lab-gpu.tgz" -C /tmp/pack .
}
R=/tmp/results
mkdir -p $R
if [ -n "${CHECK_WALL:-}" ]; then  # the doctor's wall time beside accelerate test, before the lab loads the GPU
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site-doctor . > /tmp/install3.txt 2>&1 \
    || tail -5 /tmp/install3.txt
  stamp "\$ TORCH_CUDA_ARCH_LIST=9.0 python3 bench/check_wall.py --repeats $CHECK_WALL --json"
  ( export PYTHONPATH=/tmp/site-doctor:$PYTHONPATH PATH=/tmp/site-doctor/bin:$PATH TORCH_CUDA_ARCH_LIST=9.0
    mgft-doctor check --json > "$OUT/check_cold.json" 2>/dev/null   # fills the JIT cache
    python3 bench/check_wall.py --python python3 --accelerate "$(command -v accelerate)" --doctor "$(command -v mgft-doctor)" \
      --repeats "$CHECK_WALL" --json > "$OUT/check_wall.json" 2>> "$T" )
  stamp "check_wall: $(cat "$OUT/check_wall.json" | head -c 400)"
fi
if [ -n "${1:-}" ]; then
  stamp "\$ python3 bench/lab.py run --gpu --jobs ${LAB_JOBS:-5} ${LAB_ANY:+--any-device} $1"
  timeout ${PHASE1_S:-3600} python3 bench/lab.py run --gpu --jobs ${LAB_JOBS:-5} ${LAB_ANY:+--any-device} --results $R/a.json $1 2>&1 | tee -a "$T"; pack
fi
if [ -n "${2:-}" ]; then
  stamp "\$ python3 bench/lab.py run --gpu --fix --jobs 4 $2"
  python3 bench/lab.py run --gpu --fix --jobs 4 --results $R/b.json $2 2>&1 | tee -a "$T"; pack
fi
if [ -n "${3:-}" ]; then
  stamp "\$ python3 bench/lab.py run --gpu --fix $3"
  python3 bench/lab.py run --gpu --fix --results $R/c.json $3 2>&1 | tee -a "$T"; pack
fi
stamp "done"
ls -la "$OUT"
