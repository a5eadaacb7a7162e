#!/usr/bin/env bash
# Serving and batched decode on the H200 (docs/benchmarks.md, "Serving on the
# H200"): gemma4-12b bf16, random weights, archgen against mlx-lm 0.32.2 on
# MLX's CUDA backend, in the same calls.
#
#   CARRY=dir1 bash runtime/mlx-cuda/parity.sh half1      # call 1: the wheel's first half
#   CARRY=dir2 bash runtime/mlx-cuda/parity.sh setup      # call 2: wheels + binaries ...
#   bash runtime/mlx-cuda/serve_bench_gpu.sh batch        # ... then batch decode (batch_bench.py)
#   bash runtime/mlx-cuda/serve_bench_gpu.sh serve        # call 3: the servers (serve_bench_gpu.py)
#   bash runtime/mlx-cuda/serve_bench_gpu.sh serve-full-archgen  # or the CPU script's whole run
#   bash runtime/mlx-cuda/serve_bench_gpu.sh serve-full-mlx-lm   # (tests/python/serve_bench.py), a call each
#   bash runtime/mlx-cuda/serve_bench_gpu.sh long-probe  # a long prompt's first token (long_prefill_probe.py)
#
# parity.sh's setup leaves the three wheels in /tmp/site and the release
# binaries in /tmp/archgen and /tmp/archgen-bench on the warm machine (its
# header says how the carried folder is made). `batch` also makes the
# checkpoint (archgen init --seed 2, /tmp/parity/bench-gemma4-12b) and its
# chat tokenizer (tests/python/make_chat_tokenizer.py with the Qwen3
# template, padded to the whole vocabulary by pad_tokenizer_vocab.py); `serve`
# reuses them. Logs and JSON go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
spec=${SPEC:-gemma4-12b}
model=/tmp/parity/bench-$spec
[[ -d /tmp/site/mlx && -x /tmp/archgen && -x /tmp/archgen-bench ]] \
  || { echo "no setup on this machine: run parity.sh setup first"; exit 1; }
torch_site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
nv=$(ls -d "$torch_site"/nvidia/*/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="/tmp/site/mlx/lib:/tmp/site/mlx_cuda_13.libs:${nv}${LD_LIBRARY_PATH:-}"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# MLX's CUDA backend keeps at most 400 CUDA graphs by default and raises
# "Cache thrashing is happening" once continuous batching (a new graph for
# each batch size and cache shape) cycles through more: on the H200 that
# killed mlx_lm.server's generation thread at 8 clients and failed every
# archgen request at 32 (docs/benchmarks.md, "Serving on the H200"). Both
# servers get the larger cache the error message asks for: 40,000, archgen
# serve's own default since 4,000 filled up in one benchmark run and slowed
# a long prompt after it to 10 s (docs/benchmarks.md, "The long prompt's
# first token on the H200").
export MLX_CUDA_GRAPH_CACHE_SIZE=${MLX_CUDA_GRAPH_CACHE_SIZE:-40000}

for step in "$@"; do
  case $step in
    checkpoint|batch)
      # The checkpoint and its tokenizer first, so that `serve` has them
      # even if the batch benchmark runs out of time.
      if [[ ! -f $model/config.json ]]; then
        t=$SECONDS
        /tmp/archgen init --spec "$repo/specs/$spec.yaml" --out "$model" --seed 2 2>&1 | tail -1
        echo "init: $((SECONDS - t)) s"
      fi
      if [[ ! -f $model/tokenizer.json ]]; then
        python3 "$repo/tests/python/make_chat_tokenizer.py" "$model" \
          "$repo/runtime/cli/tests/fixtures/chat_templates/qwen3.jinja" \
          && python3 "$here/pad_tokenizer_vocab.py" "$model"
      fi
      [[ $step == checkpoint ]] && continue
      python3 "$here/batch_bench.py" --archgen /tmp/archgen --bench /tmp/archgen-bench --repo "$repo" \
        --model "$model" --json "$OUT/batch.json" ${BATCH_ARGS:-} "$spec" 2>&1 | tee "$OUT/batch.log"
      ;;
    serve)
      [[ -f $model/tokenizer.json ]] || { echo "no checkpoint with a tokenizer: run batch first"; exit 1; }
      nvidia-smi --query-gpu=memory.used --format=csv,noheader
      python3 "$here/serve_bench_gpu.py" --archgen /tmp/archgen --model "$model" --repo "$repo" \
        --logs "$OUT" --json "$OUT/serve.json" --markdown "$OUT/serve.md" ${SERVE_ARGS:-} 2>&1 | tee "$OUT/serve.log"
      ;;
    serve-full-*)
      # The CPU benchmark's whole script (tests/python/serve_bench.py: 1, 4,
      # 16 and 64 clients, the same with a 12k-token request in flight, and
      # the probes) on this checkpoint, one server per call so that each
      # call stays under the device's 10 minutes; a later server's call
      # adds the earlier one's results to its table.
      server=${step#serve-full-}
      [[ -f $model/tokenizer.json ]] || { echo "no checkpoint with a tokenizer: run batch first"; exit 1; }
      earlier=()
      [[ -f /tmp/serve-full.json ]] && earlier=(--with-results /tmp/serve-full.json)
      python3 "$repo/tests/python/serve_bench.py" --archgen /tmp/archgen --model "$model" \
        --workdir /tmp/serve-full --servers "$server" "${earlier[@]}" ${SERVE_ARGS:-} \
        --json "$OUT/serve-full-$server.json" --markdown "$OUT/serve-full.md" 2>&1 | tee "$OUT/serve-full-$server.log"
      cp "$OUT/serve-full-$server.json" /tmp/serve-full.json
      ;;
    long-probe)
      # Where a long prompt's time to first token goes (long_prefill_probe.py):
      # archgen, archgen without the compiled one-token blocks, mlx-lm.
      [[ -f $model/tokenizer.json ]] || { echo "no checkpoint with a tokenizer: run batch first"; exit 1; }
      python3 "$here/long_prefill_probe.py" --archgen /tmp/archgen --model "$model" --out "$OUT" \
        ${PROBE_ARGS:-} 2>&1 | tee "$OUT/long_prefill.log"
      ;;
    *) echo "unknown step $step (checkpoint, batch, serve, serve-full-SERVER or long-probe)"; exit 2 ;;
  esac
done
