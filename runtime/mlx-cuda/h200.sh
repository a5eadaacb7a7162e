#!/usr/bin/env bash
# Runs on the GPU machine (see docs/benchmarks.md, "NVIDIA H200"): the archgen
# binary built on the CPU machine, with MLX's CUDA libmlx (PyPI mlx-cuda-13
# 0.32.2, same headers and ABI as the CPU wheel) first on its library path.
#   WHEEL=/path/to/unpacked/mlx-cuda-13  ARCHGEN=/path/to/archgen  OUT=dir  bash h200.sh [parity|speed|all]
set -uo pipefail
WHEEL=${WHEEL:?unpacked mlx-cuda-13 wheel}
ARCHGEN=${ARCHGEN:?archgen binary}
OUT=${OUT:-/tmp/out}
what=${1:-all}
mkdir -p "$OUT"
site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
nv=$(ls -d "$site"/nvidia/*/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="$WHEEL/mlx/lib:$WHEEL/mlx_cuda_13.libs:${nv}${LD_LIBRARY_PATH:-}"
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
ck=/tmp/ck
mkdir -p $ck
log() { echo "== $*"; }

log "libmlx: $(ldd "$ARCHGEN" | grep libmlx)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

ids() { python3 -c "print(','.join(str((i*37+11)%$2) for i in range($1)))"; }

parity() {  # spec, prompt length, decode steps
  local s=$1 L=$2 N=$3 vocab
  "$ARCHGEN" init --spec "$repo/specs/$s.yaml" --out $ck/$s --seed 1 2>&1 | tail -1
  vocab=$(python3 -c "import json;c=json.load(open('$ck/$s/config.json'));print(c.get('text_config',c)['vocab_size'])")
  for i in generated monolith; do
    "$ARCHGEN" logits --model $ck/$s --prompt-ids "$(ids $L $vocab)" --decode-steps $N --impl $i \
      --out $ck/$s/$i.safetensors 2>&1 | grep -v "^archgen: running" || true
  done
  echo "$s L=$L N=$N generated vs monolith: $(python3 "$here/compare.py" $ck/$s/generated.safetensors $ck/$s/monolith.safetensors)"
}

if [[ $what == parity || $what == all ]]; then
  log "parity: generated vs monolith on the GPU (archgen logits protocol)"
  for s in ${PARITY_SPECS:-gemma4-e2b-tiny gemma4-e4b-tiny gemma4-12b-tiny gemma4-31b-tiny gemma4-walkthrough-tiny \
           gemma4-e4b-tiny-kv gemma4-12b-tiny-q4 gemma4-26b-a4b-tiny gemma4-26b-a4b-tiny-q8}; do
    parity $s 24 20
  done
  if [[ ${PARITY_L6:-1} == 1 ]]; then
    parity gemma4-12b-l6 1100 40    # real width, prompt past the 1024 window
    rm -rf $ck/gemma4-12b-l6
  fi
fi

if [[ $what == speed || $what == all ]]; then
  log "device-to-device copy bandwidth (torch, 8 GiB, mean of 10 after 3 warm-ups)"
  python3 - <<'PY'
import torch, time
n = 8 << 30
x = torch.empty(n, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): y.copy_(x)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
print(f"copy: {n/dt/1e12:.2f} TB/s read, {2*n/dt/1e12:.2f} TB/s read+write")
PY
  for s in ${SPEED_SPECS:-gemma4-12b gemma4-12b-q4}; do
    "$ARCHGEN" init --spec "$repo/specs/$s.yaml" --out $ck/$s --seed 2 2>&1 | tail -1
    du -sh $ck/$s
    p=$(ids 128 262144)
    for round in $(seq 1 ${ROUNDS:-2}); do
      for i in generated monolith; do
        echo "$s round $round $i: $("$ARCHGEN" generate --model $ck/$s --prompt-ids "$p" --max-tokens 128 --ignore-eos --impl $i 2>&1 >/dev/null | grep tokens/s)"
      done
    done
    rm -rf $ck/$s
  done
fi
