#!/usr/bin/env bash
# Graph diff of one spec against mlx-lm, on the CPU (docs/parity.md, "On the GPU"):
#
#   bash runtime/mlx-cuda/graphdiff.sh SPEC [N]     # N prompt tokens, default 24
#
# `archgen init` makes a seeded checkpoint of specs/SPEC.yaml; then the
# mlx-lm worker (tests/python/bench_mlx_lm.py) and the archgen-bench worker
# for --impl generated and --impl monolith each answer `dot prefill N FILE`
# and `dot step FILE` (the logits' graphs, unevaluated, as DOT), and
# graph_diff.py compares archgen's against mlx-lm's. Files land in
# OUT (default /tmp/graphdiff/SPEC): {mlx-lm,generated,monolith}.{prefill,step}.dot
# and the diffs *.diff. Environment: ARCHGEN / ARCHGEN_BENCH (binaries,
# default $CARGO_TARGET_DIR/debug/...), PYTHON (default the repo's .venv),
# INIT_DTYPE (the checkpoint's dtype, default bfloat16).
set -euo pipefail
spec=${1:?usage: graphdiff.sh SPEC [N]}
n=${2:-24}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
ARCHGEN=${ARCHGEN:-$target/debug/archgen}
ARCHGEN_BENCH=${ARCHGEN_BENCH:-$target/debug/archgen-bench}
PYTHON=${PYTHON:-$repo/.venv/bin/python}
OUT=${OUT:-/tmp/graphdiff/$spec}
[[ -f $repo/specs/$spec.yaml ]] || { echo "graphdiff: no spec $repo/specs/$spec.yaml"; exit 2; }
for b in "$ARCHGEN" "$ARCHGEN_BENCH"; do
  [[ -x $b ]] || { echo "graphdiff: $b missing: cargo build -p archgen-cli -p archgen-bench"; exit 2; }
done
mkdir -p "$OUT"
rm -rf "$OUT/model"
# INIT_DTYPE: float32 for unquantized experts (MLX's CPU GatherMM has no bf16).
"$ARCHGEN" init --spec "$repo/specs/$spec.yaml" --out "$OUT/model" --seed 1 --dtype "${INIT_DTYPE:-bfloat16}" >/dev/null

# One worker: its `dot` answers, failing loudly if it does not answer "ready"
# and two "dot" lines.
dots() {
  local name=$1; shift
  printf 'dot prefill %s %s\ndot step %s\nquit\n' "$n" "$OUT/$name.prefill.dot" "$OUT/$name.step.dot" \
    | "$@" > "$OUT/$name.log" 2> "$OUT/$name.err" \
    || { echo "graphdiff: $name worker failed:"; tail -5 "$OUT/$name.err"; exit 1; }
  [[ $(grep -c '"dot"' "$OUT/$name.log") == 2 ]] \
    || { echo "graphdiff: $name worker did not write both graphs:"; cat "$OUT/$name.log"; tail -5 "$OUT/$name.err"; exit 1; }
  echo "$name: $(grep '"dot"' "$OUT/$name.log" | tr '\n' ' ')"
}
dots mlx-lm "$PYTHON" "$repo/tests/python/bench_mlx_lm.py" --model "$OUT/model"
dots generated "$ARCHGEN_BENCH" worker --impl generated --model "$OUT/model"
dots monolith "$ARCHGEN_BENCH" worker --impl monolith --model "$OUT/model"
status=0
for impl in generated monolith; do
  for what in prefill step; do
    if "$PYTHON" "$here/graph_diff.py" "$OUT/$impl.$what.dot" "$OUT/mlx-lm.$what.dot" > "$OUT/$impl.$what.diff"; then
      echo "$spec $impl $what (N=$n): no structural difference from mlx-lm"
    else
      echo "$spec $impl $what (N=$n): differs from mlx-lm, see $OUT/$impl.$what.diff"
      status=1
    fi
  done
done
exit $status
