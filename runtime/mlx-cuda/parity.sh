#!/usr/bin/env bash
# On the GPU machine (docs/parity.md, "On the GPU"): mlx-lm 0.32.2 on MLX's CUDA
# backend against the CPU-built `archgen` binary running on the same libmlx.
#
#   CARRY=dir bash runtime/mlx-cuda/parity.sh half1          # 1st call: keep half 1 of the wheel
#   CARRY=dir bash runtime/mlx-cuda/parity.sh setup STEP...  # 2nd call: assemble, then run STEPs
#   CARRY=dir bash runtime/mlx-cuda/parity.sh again STEP...  # later calls to the same warm
#                                                           # machine: run STEPs on that setup
#
# CARRY holds what travelled with the call: mlx_cuda_13.whl.part1 (first call)
# or .part2, the mlx and mlx-lm wheels (whl/), and archgen.xz /
# archgen-bench.xz (xz-compressed, stripped release binaries; optionally
# archgen-bench-baseline.xz, an older commit's, for bench.py's `baseline`). The
# mlx-cuda-13 wheel (83 MiB) is larger than one call may carry, so it comes in
# two halves in two back-to-back calls to the same warm machine; the three
# wheels are installed with pip --target into /tmp/site, so Python's mlx and
# the archgen binary load the same libmlx.so (the binary through
# LD_LIBRARY_PATH). CUDA's own libraries come from the image's PyTorch.
# Making CARRY here: `split -b 52000000 -d -a 1 mlx_cuda_13-0.32.2-*.whl part`
# (part0 -> DIR1/mlx_cuda_13.whl.part1, part1 -> DIR2/mlx_cuda_13.whl.part2;
# sha256 of the whole wheel 335094cc...), the wheels from `pip download` as in
# the device README, `strip` + `xz` of target/release/{archgen,archgen-bench}.
# STEPs: table (the GPU parity table: gpu_parity.py), parity (every case below), fma (fma_probe.py), probe (q4_probe.py), align
# (align_probe.py), mla (mla_probe.py: DeepSeek-V3's attention forms), diagnose SPEC (kernels launched by mlx-lm and by the
# monolith, kernel_diff.py; DIAG_N prompt tokens), bench (bench.py), blocks (block_probe.py:
# mlx-lm's post-attention half eager against mx.compile), sanitize
# (compute-sanitizer's initcheck, memcheck and racecheck on the monolith), profile
# (step_profile.py: one decode step's kernels, archgen and mlx-lm, through ncu), repeat
# (whether archgen and mlx-lm repeat their own bytes on one spec, fresh processes),
# closeness (an L3 lever's logits against L1's: lever_closeness.py), headcheck (the
# cuda-head-norm-rope kernel against MLX's kernels: head_kernel_check.py), trace SPEC (the
# mlx-lm module a CUDA fault happens in: module_trace.py), backtrace SPEC (an archgen abort's host stacks
# under cuda-gdb, then with glibc's heap checks; BT_L, BT_STEPS, BT_IMPL), coldstart (a process's wall time with
# an empty and a filled NVRTC cache, archgen and mlx-lm; COLD_SPEC, COLD_L), kernelcache (archgen's
# default kernel cache under a fresh HOME: two runs, where the kernels went; KC_SPEC), speedtable (one
# table: single stream, batched B and serving C clients, each archgen L1, archgen L3 and mlx-lm, with
# the share of the weight-read bound: speed_table.py on SPEEDTABLE_SPEC, default gemma4-12b;
# SPEEDTABLE_ARGS for sizes, e.g. "--batches 1 8 --clients 1 4 --rounds 2 --steps 16"; a real-size
# table can outlast one call: "--only single batch --keep", then "--only serve --reuse" in the next;
# "--pairs" runs L1 and L3 each in rounds of their own beside mlx-lm, two copies of the weights at a
# time: a 12B's three do not fit an 80 GB H100).
# Graph diff on the CPU (no device needed): runtime/mlx-cuda/graphdiff.sh SPEC [N]
# writes mlx-lm's, the generated model's and the monolith's logits graphs
# (prefill over N ids, one decode step) as DOT and compares them with
# graph_diff.py (docs/parity.md, "Graph differences found on the CPU").
set -uo pipefail
CARRY=${CARRY:?folder that travelled with the call}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
what=${1:?half1 or setup}
shift

if [[ $what == half1 ]]; then
  cp "$CARRY"/mlx_cuda_13.whl.part1 /tmp/ && ls -la /tmp/mlx_cuda_13.whl.part1
  exit 0
fi

# --- setup: the wheel from its halves, the three wheels, the binaries
# (`again`: what an earlier `setup` call left in /tmp on this warm machine)
if [[ $what == setup ]]; then
  cat /tmp/mlx_cuda_13.whl.part1 "$CARRY"/mlx_cuda_13.whl.part2 > /tmp/mlx_cuda_13-0.32.2-py3-none-manylinux_2_35_x86_64.whl
  echo "wheel sha256 $(sha256sum /tmp/mlx_cuda_13-*.whl | cut -c1-16) (expect ${WHEEL_SHA:-?})"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/mlx_cuda_13-*.whl "$CARRY"/whl/*.whl || exit 1
  for b in archgen archgen-bench archgen-bench-baseline; do
    [[ -f $CARRY/$b.xz ]] && xz -dc "$CARRY/$b.xz" > /tmp/$b && chmod +x /tmp/$b
  done
elif [[ $what != again ]]; then
  echo "unknown mode $what (half1, setup or again)"; exit 2
fi
[[ -d /tmp/site/mlx && -x /tmp/archgen ]] || { echo "no setup on this machine: run setup first"; exit 1; }
torch_site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
nv=$(ls -d "$torch_site"/nvidia/*/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="/tmp/site/mlx/lib:/tmp/site/mlx_cuda_13.libs:${nv}${LD_LIBRARY_PATH:-}"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export ARCHGEN=/tmp/archgen
# An older build's archgen-bench (archgen-bench-baseline.xz in CARRY): bench.py's
# and speed_table.py's `baseline` worker, for a paired A/B of two binaries.
[[ -x /tmp/archgen-bench-baseline ]] && export BENCH_BASELINE=/tmp/archgen-bench-baseline
echo "== $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
echo "== archgen loads $(ldd $ARCHGEN | grep libmlx)"
python3 -c 'import mlx.core as mx, mlx_lm; print("== python mlx", mx.__version__, mx.default_device(), mlx_lm.__file__)' || exit 1
work=/tmp/parity
mkdir -p $work

# The protocol's prompt ids, (i * 37 + 11) % vocab for i < L, of the
# checkpoint in DIR (its config.json, flat or a wrapper's text_config).
vocab_of() {  # DIR
  python3 -c "import json; c=json.load(open('$1/config.json')); print(c.get('text_config', c)['vocab_size'])"
}
prompt_ids() {  # DIR L
  python3 -c "print(','.join(str((i * 37 + 11) % $(vocab_of "$1")) for i in range($2)))"
}

# Every tiny spec (specs/*-tiny*.yaml; PARITY_TINY: a space-separated list
# instead); the prompt passes each sliding window.
TINY=${PARITY_TINY-$(cd "$repo/specs" && ls *tiny*.yaml | sed 's/\.yaml$//')}
# Real width, reduced layers, per family, bf16 and 4-bit (parity.py's
# EXTRA_SPECS for those not in specs/), and the full small dense models.
REAL="gemma4-12b-l6:1100:20 gemma4-12b-l6-q4:1100:20 gemma4-12b-q4:128:8 qwen3-8b-l4:40:12 qwen3-8b-l4-q4:40:12 \
llama-3.2-3b-l4-q4:40:12 qwen3-0.6b:24:12 llama-3.2-1b:24:12"
# The GPU parity table's real-width cases: every reduced real-width spec in
# specs/ (NAME-lN or NAME-lN-qB; each has a generated model), read from the
# directory so a new family's spec is never left out, prompt 300
# (gemma4-12b-l6: 1,100, past its 1,024 window), and the full small dense
# models of families without one.
TABLE_REAL=$(cd "$repo/specs" && ls | sed -nE 's/^(.*-l[0-9]+(-q[0-9]+)?)\.yaml$/\1/p' |
  while read -r s; do
    case $s in gemma4-12b-l6) echo "$s:1100:20" ;; *) echo "$s:300:20" ;; esac
  done | tr '\n' ' ')
TABLE_REAL="$TABLE_REAL qwen3-0.6b:300:20 llama-3.2-1b:300:20"

while (($#)); do
  step=$1; shift
  case $step in
    parity)
      cases=""
      for s in $TINY; do cases="$cases $s:24:20"; done
      python3 "$here/parity.py" --archgen $ARCHGEN --repo "$repo" --work $work $cases ${PARITY_REAL-$REAL} \
        2>&1 | tee -a "$OUT/parity.log"
      ;;
    diagnose)
      spec=$1; shift
      d=$work/diag-$spec; mkdir -p $d/dot-mlxlm $d/dot-mono $d/dot-gen
      $ARCHGEN init --spec "$repo/specs/$spec.yaml" --out $d/model --seed 1 2>&1 | tail -1
      # DIAG_N prompt tokens (24 by default; a real-width case may need its table's length)
      ids=$(python3 -c "print(','.join(str((i*37+11)%512) for i in range(${DIAG_N:-24})))")
      MLX_SAVE_CUDA_GRAPHS_DOT_FILE=$d/dot-mono/g $ARCHGEN logits --model $d/model --prompt-ids $ids \
        --decode-steps 2 --impl monolith --out $d/mono.safetensors 2>&1 | tail -1
      MLX_SAVE_CUDA_GRAPHS_DOT_FILE=$d/dot-gen/g $ARCHGEN logits --model $d/model --prompt-ids $ids \
        --decode-steps 2 --impl generated --out $d/gen.safetensors 2>&1 | tail -1
      (cd "$repo/tests/python" && MLX_SAVE_CUDA_GRAPHS_DOT_FILE=$d/dot-mlxlm/g python3 oracle_logits.py \
        --model $d/model --prompt-ids $ids --decode-steps 2 --out $d/mlxlm.safetensors)
      python3 -c "import sys; sys.path.insert(0, '$here'); from parity import compare; from pathlib import Path as P; d=P('$d');
print('diag mono/mlx-lm', compare(d/'mono.safetensors', d/'mlxlm.safetensors'));
print('diag gen/mlx-lm', compare(d/'gen.safetensors', d/'mlxlm.safetensors'))"
      echo "== kernels: mlx-lm (A) vs monolith (B)"
      python3 "$here/kernel_diff.py" $d/dot-mlxlm $d/dot-mono 2>&1 | tee "$OUT/kernels-$spec.txt"
      echo "== kernels: monolith (A) vs generated (B)"
      python3 "$here/kernel_diff.py" $d/dot-mono $d/dot-gen 2>&1 | head -30
      tar -C $d -czf "$OUT/dots-$spec.tgz" dot-mlxlm dot-mono dot-gen
      ;;
    table)
      # gpu_parity.py: every case x {generated, monolith} x {one sequence,
      # two batch schedules} against mlx-lm in fresh processes (TABLE_CASES:
      # SPEC:L:N list, SPEC@DTYPE:L:N for a checkpoint in DTYPE, instead of every tiny spec at 24 / 20 and the reduced
      # real-width specs; TABLE_JOBS cases at a time).
      # TABLE_FIRST: cases to start before the others (same SPEC:L:N form).
      cases=${TABLE_CASES:-}
      if [[ -z $cases ]]; then
        all=""
        for s in $TINY; do all="$all $s:24:20"; done
        cases="${TABLE_FIRST:-}"
        for c in $all $TABLE_REAL; do
          [[ " $cases " == *" ${c%%:*}:"* ]] || cases="$cases $c"
        done
      fi
      python3 "$here/gpu_parity.py" --archgen $ARCHGEN --repo "$repo" --work $work/table \
        --jobs ${TABLE_JOBS:-6} --timeout ${TABLE_TIMEOUT:-150} --json "$OUT/gpu-parity.json" $cases 2>&1 | tee -a "$OUT/gpu-parity.log"
      ;;
    mla)
      # mla_probe.py: mlx-lm's DeepSeek-V3 attention rewritten in the forms
      # archgen's graph takes, one at a time, against archgen (MLA_SPEC, MLA_L);
      # MLA_REPEAT=N: mlx-lm's own module N times in one process instead.
      spec=${MLA_SPEC:-deepseek-v3-tiny}
      tag=$spec${MLA_REPEAT:+-repeat$MLA_REPEAT}${MLX_CUDA_USE_CUDNN_SDPA:+-cudnn-sdpa$MLX_CUDA_USE_CUDNN_SDPA}
      d=$work/mla-$spec; mkdir -p $d
      [[ -f $d/model/config.json ]] || $ARCHGEN init --spec "$repo/specs/$spec.yaml" --out $d/model --seed 1 2>&1 | tail -1
      echo "== mla $tag" | tee -a "$OUT/mla.log"
      python3 "$here/mla_probe.py" --model $d/model --archgen $ARCHGEN --prompt-len ${MLA_L:-24} \
        --repeat ${MLA_REPEAT:-0} --out "$OUT/mla-$tag.json" 2>&1 | tee -a "$OUT/mla.log"
      ;;
    fma)
      python3 "$here/fma_probe.py" 2>&1 | tee -a "$OUT/fma.log"
      ;;
    align)
      python3 "$here/align_probe.py" 2>&1 | tee -a "$OUT/align.log"
      ;;
    blocks)
      # block_probe.py: mlx-lm's post-attention half eager against mx.compile
      d=$work/blocks; mkdir -p $d
      for s in ${BLOCK_SPECS:-gemma4-12b-tiny gemma4-e2b-tiny gemma-2-2b-tiny qwen3-0.6b-tiny}; do
        [[ -f $d/$s/config.json ]] || $ARCHGEN init --spec "$repo/specs/$s.yaml" --out $d/$s --seed 1 2>&1 | tail -1
      done
      python3 "$here/block_probe.py" $d/* 2>&1 | tee -a "$OUT/blocks.log"
      ;;
    sanitize)
      # compute-sanitizer (initcheck, memcheck, racecheck) on the monolith's
      # protocol for one spec: does an MLX CUDA kernel read memory nothing
      # wrote, out of bounds, or race? (4-bit Gemma-4 is not reproducible.)
      spec=${SANITIZE_SPEC:-gemma4-12b-tiny-q4}
      d=$work/sanitize-$spec; mkdir -p $d
      [[ -f $d/model/config.json ]] || $ARCHGEN init --spec "$repo/specs/$spec.yaml" --out $d/model --seed 1 2>&1 | tail -1
      ids=$(prompt_ids $d/model 24)
      cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
      echo "== compute-sanitizer: ${cs:-not found}"
      for tool in ${SANITIZE_TOOLS:-initcheck memcheck racecheck}; do
        echo "== $tool on $spec (monolith, 24 tokens, 3 decode steps)"
        timeout ${SANITIZE_TIMEOUT:-150} $cs --tool $tool --print-limit 20 --show-backtrace no \
          $ARCHGEN logits --model $d/model --prompt-ids $ids --decode-steps 3 --impl monolith \
          --out $d/$tool.safetensors > "$OUT/sanitize-$tool.log" 2>&1
        echo "rc=$? $(grep -c "^=========" "$OUT/sanitize-$tool.log") sanitizer lines"
        grep -E "ERROR SUMMARY|Uninitialized|Invalid|Race|hazard|in .*kernel|at 0x" "$OUT/sanitize-$tool.log" | sort | uniq -c | sort -rn | head -12
      done
      ;;
    coldstart)
      # Cold start (issue: the first 4-bit run compiles kernels for long):
      # `archgen logits` and mlx-lm's oracle_logits.py over COLD_L prompt ids
      # and 8 steps, each first with an empty NVRTC disk cache of its own
      # (MLX_PTX_CACHE_DIR) and then again with it filled; the wall time of
      # each process and how many kernels each side compiled.
      spec=${COLD_SPEC:-gemma4-12b-q4}
      d=$work/cold-$spec
      [[ -f $d/config.json ]] || $ARCHGEN init --spec "$repo/specs/$spec.yaml" --out $d --seed 1 2>&1 | tail -1
      ids=$(prompt_ids $d ${COLD_L:-128})
      for side in archgen mlx-lm archgen mlx-lm; do
        ptx=$work/ptx-$side
        if [[ -e $ptx.filled ]]; then run=warm; else run=cold; rm -rf $ptx; mkdir -p $ptx; fi
        t0=$(date +%s.%N)
        if [[ $side == archgen ]]; then
          MLX_PTX_CACHE_DIR=$ptx $ARCHGEN logits --model $d --prompt-ids $ids --decode-steps 8 \
            --out $work/cold-$side.safetensors > $work/cold-$side-$run.log 2>&1
        else
          (cd "$repo/tests/python" && MLX_PTX_CACHE_DIR=$ptx python3 oracle_logits.py --model $d \
            --prompt-ids $ids --decode-steps 8 --out $work/cold-$side.safetensors > $work/cold-$side-$run.log 2>&1)
        fi
        rc=$?
        t1=$(date +%s.%N)
        touch $ptx.filled
        echo "coldstart $spec $side $run: rc $rc, $(python3 -c "print(f'{$t1 - $t0:.1f}')") s, $(find $ptx -type f | wc -l) files in its PTX cache ($(du -sh $ptx | cut -f1))" \
          | tee -a "$OUT/coldstart.log"
      done
      ;;
    kernelcache)
      # archgen's default CUDA kernel cache (runtime/cli/src/kernel_cache.rs):
      # `archgen logits` on KC_SPEC twice with one fresh XDG_CACHE_HOME and an
      # empty TMPDIR, MLX_PTX_CACHE_DIR unset (HOME stays: the driver's own
      # cache of JIT-compiled PTX lives there): the first run compiles into
      # XDG_CACHE_HOME/archgen/mlx-kernels/..., the second finds them there;
      # MLX's own default under TMPDIR stays empty.
      spec=${KC_SPEC:-qwen3-0.6b-tiny-q4}
      d=$work/kc-$spec
      [[ -f $d/config.json ]] || $ARCHGEN init --spec "$repo/specs/$spec.yaml" --out $d --seed 1 2>&1 | tail -1
      ids=$(prompt_ids $d ${KC_L:-24})
      cache=$work/kc-cache; tmp=$work/kc-tmp; rm -rf $cache $tmp; mkdir -p $cache $tmp
      for run in first second; do
        t0=$(date +%s.%N)
        env -u MLX_PTX_CACHE_DIR XDG_CACHE_HOME=$cache TMPDIR=$tmp timeout ${KC_TIMEOUT:-200} $ARCHGEN logits --model $d \
          --prompt-ids $ids --decode-steps 8 --out $work/kc-$run.safetensors > $work/kc-$run.log 2>&1
        rc=$?; t1=$(date +%s.%N)
        echo "kernelcache $spec $run: rc $rc, $(python3 -c "print(f'{$t1 - $t0:.1f}')") s; $(grep 'kernel cache' $work/kc-$run.log); \
$(find $cache -type f | wc -l) files under XDG_CACHE_HOME ($(du -sh $cache | cut -f1)), $(find $tmp -type f | wc -l) under TMPDIR" \
          | tee -a "$OUT/kernelcache.log"
      done
      python3 "$here/compare.py" $work/kc-first.safetensors $work/kc-second.safetensors 2>&1 | sed 's/^/kernelcache first vs second: /' | tee -a "$OUT/kernelcache.log"
      ;;
    trace)
      # Which mlx-lm module a CUDA fault happens in (module_trace.py): the
      # spec's checkpoint from archgen init, every module synchronized as it
      # returns, kernels launched one at a time; TRACE_L prompt ids.
      spec=$1; shift
      d=$work/trace-$spec; mkdir -p $d
      [[ -f $d/model/config.json ]] || $ARCHGEN init --spec "$repo/specs/$spec.yaml" --out $d/model --seed 1 2>&1 | tail -1
      # First mlx-lm's one-sequence protocol as the table runs it, with
      # asynchronous and with blocking kernel launches: whether the fault
      # needs kernels in flight together.
      ids=$(prompt_ids $d/model ${TRACE_L:-24})
      for blocking in 0 1; do
        (cd "$repo/tests/python" && CUDA_LAUNCH_BLOCKING=$blocking timeout 300 python3 oracle_logits.py --model $d/model \
          --prompt-ids $ids --decode-steps 20 --out $d/oracle-$blocking.safetensors > $d/oracle-$blocking.log 2>&1)
        echo "trace $spec: mlx-lm oracle_logits.py, CUDA_LAUNCH_BLOCKING=$blocking: rc $? $(grep -m1 -i 'error' $d/oracle-$blocking.log | cut -c1-160)" \
          | tee -a "$OUT/trace-$spec.log"
      done
      CUDA_LAUNCH_BLOCKING=${TRACE_BLOCKING:-1} timeout 300 python3 "$here/module_trace.py" --model $d/model --prompt-len ${TRACE_L:-24} \
        >> "$OUT/trace-$spec.log" 2>&1
      echo "trace $spec: module trace rc $?"; tail -n 12 "$OUT/trace-$spec.log"
      ;;
    backtrace)
      # Where an archgen process aborts on the host (heap corruption, a
      # panic in a foreign frame): `archgen logits` on the spec's checkpoint
      # (BT_L prompt ids, BT_STEPS decode steps, BT_IMPL path) under
      # cuda-gdb, which debugs host code too (the image has no gdb), every
      # thread's stack at the signal; then once more with glibc's heap
      # checks on every call (MALLOC_CHECK_=3 through libc_malloc_debug),
      # which stops nearer the first bad write.
      spec=$1; shift
      d=$work/bt-$spec; mkdir -p $d
      [[ -f $d/model/config.json ]] || $ARCHGEN init --spec "$repo/specs/$spec.yaml" --out $d/model --seed 1 2>&1 | tail -1
      ids=$(prompt_ids $d/model ${BT_L:-300})
      args=(logits --model $d/model --prompt-ids $ids --decode-steps ${BT_STEPS:-20} --impl ${BT_IMPL:-generated}
        --out $d/logits.safetensors)
      timeout 400 cuda-gdb -q -batch -ex "set pagination off" -ex "set print thread-events off" -ex run \
        -ex "bt 60" -ex "thread apply all bt 25" --args $ARCHGEN "${args[@]}" > "$OUT/backtrace-$spec.log" 2>&1
      echo "backtrace $spec: cuda-gdb rc $?"; grep -n -m5 -i "signal\|abort\|corrupt" "$OUT/backtrace-$spec.log"
      debug=$(ls /lib/x86_64-linux-gnu/libc_malloc_debug.so* /usr/lib/x86_64-linux-gnu/libc_malloc_debug.so* 2>/dev/null | head -1)
      if [[ -n $debug ]]; then
        LD_PRELOAD=$debug MALLOC_CHECK_=3 timeout 300 $ARCHGEN "${args[@]}" > "$OUT/backtrace-$spec-malloc-check.log" 2>&1
        echo "backtrace $spec: with MALLOC_CHECK_=3 rc $?"; tail -n 3 "$OUT/backtrace-$spec-malloc-check.log"
      else
        echo "backtrace $spec: no libc_malloc_debug on this machine"
      fi
      ;;
    headcheck)
      # The cuda-head-norm-rope kernel against the MLX kernels it replaces,
      # element by element, on random heads (head_kernel_check.py).
      python3 "$here/head_kernel_check.py" 2>&1 | tee -a "$OUT/headcheck.log"
      ;;
    closeness)
      # An L3 lever against L1 on one checkpoint (lever_closeness.py):
      # `archgen logits` over a CLOSE_L-token prompt and CLOSE_N greedy steps,
      # once at L1 and once with CLOSE_LEVER, on the bench's checkpoint of
      # each CLOSE_SPECS (bench-SPEC, made here when the bench did not keep it).
      lever=${CLOSE_LEVER:-gpu-stacked-projections}
      for spec in ${CLOSE_SPECS:-gemma4-12b qwen3-8b}; do
        d=$work/bench-$spec
        [[ -f $d/config.json ]] || $ARCHGEN init --spec "$repo/specs/$spec.yaml" --out $d --seed 2 2>&1 | tail -1
        ids=$(prompt_ids $d ${CLOSE_L:-128})
        for run in l1 lever; do
          extra=$([[ $run == lever ]] && echo "--$lever" || echo "--l1")
          $ARCHGEN logits --model $d --prompt-ids $ids --decode-steps ${CLOSE_N:-128} --impl generated $extra \
            --out $work/close-$spec-$run.safetensors 2>&1 | grep -E "levers on|stacked|head-norm-rope|error" || true
        done
        python3 "$here/lever_closeness.py" $work/close-$spec-l1.safetensors $work/close-$spec-lever.safetensors \
          "$spec $lever" 2>&1 | tee -a "$OUT/closeness.log"
        rm -rf $d
      done
      ;;
    profile)
      # step_profile.py: one decode step's kernels (count, ncu-timed busy
      # time) and its wall time, archgen's default path against mlx-lm, on a
      # random checkpoint of each PROFILE_SPECS (deleted after).
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      echo "== ncu: ${ncu:-not found}"
      for spec in ${PROFILE_SPECS:-gemma4-12b qwen3-8b}; do
        d=$work/prof-$spec
        [[ -f $d/config.json ]] || $ARCHGEN init --spec "$repo/specs/$spec.yaml" --out $d --seed 2 2>&1 | tail -1
        vocab=$(vocab_of $d)
        NCU=$ncu python3 "$here/step_profile.py" --archgen $ARCHGEN --model $d --vocab $vocab \
          --logs "$OUT/profile" ${PROFILE_ARGS:-} 2>&1 | tee -a "$OUT/profile.log"
        rm -rf $d
      done
      ;;
    repeat)
      # Does archgen repeat its own bytes? REPEAT_SPEC's one-sequence protocol
      # (prompt REPEAT_L, REPEAT_N steps) in fresh processes: the generated
      # model three times, with MLX's CUDA graphs off twice, the monolith
      # twice, and mlx-lm twice; each compared with the first archgen run that
      # finished (a process that aborts is named, with its exit status, and
      # left out of the comparisons).
      spec=${REPEAT_SPEC:-qwen3-30b-a3b-l2-q4}; L=${REPEAT_L:-300}; N=${REPEAT_N:-20}
      d=$work/repeat-$spec; mkdir -p $d
      [[ -f $d/model/config.json ]] || $ARCHGEN init --spec "$repo/specs/$spec.yaml" --out $d/model --seed 1 2>&1 | tail -1
      ids=$(prompt_ids $d/model $L)
      run() {  # name, env..., then archgen args
        local name=$1; shift
        rm -f $d/$name.safetensors
        env "$@" --out $d/$name.safetensors > $d/$name.log 2>&1
        local rc=$?
        [[ $rc == 0 ]] || echo "repeat $spec $name: exit $rc: $(grep -v '^archgen: ' $d/$name.log | tail -1)" | tee -a "$OUT/repeat.log"
      }
      for i in 1 2 3; do run gen$i $ARCHGEN logits --model $d/model --prompt-ids $ids --decode-steps $N --impl generated; done
      for i in 1 2; do run nograph$i MLX_USE_CUDA_GRAPHS=0 $ARCHGEN logits --model $d/model --prompt-ids $ids --decode-steps $N --impl generated; done
      for i in 1 2; do run mono$i $ARCHGEN logits --model $d/model --prompt-ids $ids --decode-steps $N --impl monolith; done
      for i in 1 2; do
        rm -f $d/mlxlm$i.safetensors
        (cd "$repo/tests/python" && python3 oracle_logits.py --model $d/model --prompt-ids $ids --decode-steps $N \
          --out $d/mlxlm$i.safetensors > $d/mlxlm$i.log 2>&1) \
          || echo "repeat $spec mlxlm$i: failed: $(tail -1 $d/mlxlm$i.log)" | tee -a "$OUT/repeat.log"
      done
      have() { [[ -f $d/$1.safetensors ]]; }
      ref=""; for f in gen1 gen2 gen3 nograph1 nograph2 mono1 mono2; do have $f && { ref=$f; break; }; done
      {
        [[ -n $ref ]] || echo "repeat $spec: no archgen run finished"
        for f in gen1 gen2 gen3 nograph1 nograph2 mono1 mono2 mlxlm1 mlxlm2; do
          [[ -n $ref && $f != "$ref" ]] && have $f \
            && echo "repeat $spec $ref vs $f: $(python3 "$here/compare.py" $d/$ref.safetensors $d/$f.safetensors)"
        done
        for f in nograph2 mono2 mlxlm2; do
          a=${f%2}1; have $a && have $f \
            && echo "repeat $spec $a vs $f: $(python3 "$here/compare.py" $d/$a.safetensors $d/$f.safetensors)"
        done
      } 2>&1 | tee -a "$OUT/repeat.log"
      ;;
    probe)
      d=$work/probe; mkdir -p $d
      $ARCHGEN init --spec "$repo/specs/gemma4-12b-tiny-q4.yaml" --out $d/model --seed 1 2>&1 | tail -1
      python3 "$here/q4_probe.py" --archgen $ARCHGEN --repo "$repo" --model $d/model --work $d \
        2>&1 | tee -a "$OUT/probe.log"
      ;;
    bench)
      python3 "$here/bench.py" --archgen $ARCHGEN --bench /tmp/archgen-bench --repo "$repo" --work $work ${BENCH_ARGS:-} \
        ${BENCH_SPECS:-gemma4-12b gemma4-12b-q4 qwen3-8b gemma4-26b-a4b-q4} 2>&1 | tee -a "$OUT/bench.log"
      ;;
    speedtable)
      # speed_table.py runs bench.py, batch_bench.py and serve_bench_gpu.py
      # on one checkpoint (bench-SPEC in $work) and writes one table; its
      # logs stay in $work/speedtable (for --reuse), the table and the logs
      # are copied to $OUT.
      spec=${SPEEDTABLE_SPEC:-gemma4-12b}
      python3 "$here/speed_table.py" --archgen $ARCHGEN --bench /tmp/archgen-bench --repo "$repo" --work $work \
        --logs $work/speedtable --spec "$spec" ${BENCH_BASELINE:+--baseline-bench $BENCH_BASELINE} \
        ${SPEEDTABLE_ARGS:-} 2>&1 | tee -a "$OUT/speedtable.log"
      mkdir -p "$OUT/speedtable" && cp $work/speedtable/* "$OUT/speedtable/" 2>/dev/null
      ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
