"""The `cuda-head-norm-rope` kernel (runtime/core/src/cuda_kernels.rs) against
the MLX kernels it replaces, on the GPU, element by element.

The kernel's source is read from cuda_kernels.rs itself (its three raw
strings), so what runs here is what archgen runs. For each case (a layer's
heads, dtype, RoPE form and offsets) random projections go through

  * the kernel, as `mx.fast.cuda_kernel` with archgen's template values, and
  * the ops the compiled GPU block runs: `fast.rms_norm` per head (V without
    a weight where the layer norms V), the transpose, `fast.rope` at the
    offset(s),

and the outputs are compared: how many elements differ, the largest
difference in units in the last place of the dtype, and the largest
absolute difference. The kernel takes MLX's thread split and order, so the expected
result is no difference at all (--max-ulp 0).

Usage: head_kernel_check.py [--source runtime/core/src/cuda_kernels.rs]
Exit status 1 when an element is more than --max-ulp units off.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import mlx.core as mx


def kernel_sources(path: Path) -> dict[str, str]:
    text = path.read_text()
    found = {}
    for name in ("STACKED_ROWS", "SEPARATE_ROWS", "HEAD_NORM_ROPE_BODY"):
        m = re.search(rf'const {name}: &str = r#"(.*?)"#;', text, re.S)
        if not m:
            raise SystemExit(f"{path}: no raw string {name}")
        found[name] = m.group(1)
    return found


def ulps(a: mx.array, b: mx.array) -> int:
    """Largest distance between a and b in units in the last place."""
    bits = {mx.bfloat16: mx.uint16, mx.float16: mx.uint16, mx.float32: mx.uint32}[a.dtype]
    wide = mx.int64

    def ordered(x):
        u = x.view(bits).astype(wide)
        sign = 1 << (8 * x.dtype.size - 1)
        return mx.where(u >= sign, sign - u, u)

    return int(mx.max(mx.abs(ordered(a) - ordered(b))).item())


def norm_threads(axis: int, itemsize: int) -> tuple[int, int]:
    """MLX's rms_norm split of a row (threads, chunks), as NormThreads::of."""
    reads = 16 // itemsize
    vectors = (axis + reads - 1) // reads
    if axis <= reads * 64:
        return 64, 1
    if vectors % 128 == 0 and vectors // 128 <= 8:
        return 128, vectors // 128
    if vectors % 64 == 0 and vectors // 64 <= 8:
        return 64, vectors // 64
    return 128, (vectors + 127) // 128


def check(src, case, max_ulp) -> bool:
    b, h, kv, d = case["rows"], case["heads"], case["kv_heads"], case["head_dim"]
    dtype, eps = case["dtype"], case["eps"]
    stacked, own_values, value_norm = case["stacked"], case["own_values"], case["value_norm"]
    rot, rope = case["rot"], case["rope"]
    mx.random.seed(case["seed"])
    widths = [h * d, kv * d] + ([kv * d] if own_values else [])
    parts = [(mx.random.normal((b, w)) * 3.0).astype(dtype) for w in widths]
    q_norm = (1.0 + 0.1 * mx.random.normal((d,))).astype(dtype)
    k_norm = (1.0 + 0.1 * mx.random.normal((d,))).astype(dtype)
    offsets = mx.array(case["offsets"], dtype=mx.int32)
    per_row = offsets.size > 1
    if rope == "base":
        base, scale = case["base"], case.get("scale", 1.0)
        periods = mx.array([0.0])
        params = mx.array([eps, math.log2(base), scale], dtype=mx.float32)
    else:
        periods = case["periods"]
        base, scale = None, 1.0
        params = mx.array([eps, 0.0, 1.0], dtype=mx.float32)

    # The blocks' ops (blocks::Projected::heads with native fast ops).
    def heads(t, n):
        return t.reshape(b, 1, n, d)

    def rotate(t):
        if rot == 0:
            return t
        off = offsets if per_row else offsets[0]
        if rope == "base":
            return mx.fast.rope(t, rot, traditional=False, base=base, scale=scale, offset=off)
        return mx.fast.rope(t, rot, traditional=False, base=None, scale=1.0, offset=off, freqs=periods)

    q_ref = rotate(mx.fast.rms_norm(heads(parts[0], h), q_norm, eps).transpose(0, 2, 1, 3))
    k_ref = rotate(mx.fast.rms_norm(heads(parts[1], kv), k_norm, eps).transpose(0, 2, 1, 3))
    v_src = heads(parts[2] if own_values else parts[1], kv)
    v_ref = (mx.fast.rms_norm(v_src, None, eps) if value_norm else v_src).transpose(0, 2, 1, 3)

    rows = src["STACKED_ROWS"] if stacked else src["SEPARATE_ROWS"]
    if stacked:
        names = ["qkv", "q_norm", "k_norm", "offset", "periods", "params"]
        inputs = [mx.concatenate(parts, axis=-1), q_norm, k_norm, offsets, periods, params]
    else:
        names = ["q", "k", "v", "q_norm", "k_norm", "offset", "periods", "params"]
        v_in = parts[2] if own_values else parts[1]
        inputs = [parts[0], parts[1], v_in, q_norm, k_norm, offsets, periods, params]
    kernel = mx.fast.cuda_kernel(
        name="check_head_norm_rope_" + ("stacked" if stacked else "separate"),
        input_names=names,
        output_names=["q_out", "k_out", "v_out"],
        source=rows + "\n" + src["HEAD_NORM_ROPE_BODY"],
    )
    threads, chunks = norm_threads(d, dtype.size)
    q, k, v = kernel(
        inputs=inputs,
        template=[
            ("T", dtype), ("D", d), ("NT", threads), ("CHUNKS", chunks), ("HQ", h), ("HK", kv), ("ROT", rot),
            ("PERIODS", rope == "periods"), ("V_NORM", value_norm),
            ("V_OWN", own_values), ("OFFSET_PER_ROW", per_row),
        ],
        grid=(threads, b * (h + 2 * kv), 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(b, h, 1, d), (b, kv, 1, d), (b, kv, 1, d)],
        output_dtypes=[dtype, dtype, dtype],
    )
    mx.eval(q, k, v, q_ref, k_ref, v_ref)
    ok = True
    report = []
    for name, got, want in (("q", q, q_ref), ("k", k, k_ref), ("v", v, v_ref)):
        differ = int(mx.sum(got != want).item())
        u = ulps(got, want)
        diff = float(mx.max(mx.abs(got.astype(mx.float32) - want.astype(mx.float32))).item())
        report.append(f"{name} {differ} of {got.size} differ (max {u} ulp, |diff| {diff:.3g})")
        ok &= u <= max_ulp
    print(f"head-kernel {case['name']}: " + "; ".join(report) + ("" if ok else "  FAIL"), flush=True)
    return ok


def proportional_periods(dims: int, rotated: int, base: float, factor: float = 1.0) -> mx.array:
    """Gemma-4's ProportionalRoPE periods, float32: the rotated pairs, then inf."""
    exps = mx.arange(0, rotated, 2, dtype=mx.float32) / dims
    periods = factor * (base ** exps)
    return mx.concatenate([periods, mx.full(((dims - rotated) // 2,), math.inf)])


def main() -> None:
    ap = argparse.ArgumentParser()
    here = Path(__file__).resolve().parent
    ap.add_argument("--source", type=Path, default=here.parent / "core" / "src" / "cuda_kernels.rs")
    ap.add_argument("--max-ulp", type=int, default=0)
    a = ap.parse_args()
    src = kernel_sources(a.source)
    far = [0, 1, 127, 4095, 100_000]
    cases = []
    for dtype in (mx.bfloat16, mx.float16, mx.float32):
        tag = {mx.bfloat16: "bf16", mx.float16: "f16", mx.float32: "f32"}[dtype]
        for off in far:
            # qwen3-8b: 32 / 8 heads of 128, RoPE base 1e6, no V norm.
            cases.append(dict(name=f"qwen3-8b {tag} separate offset {off}", rows=1, heads=32,
                              kv_heads=8, head_dim=128, dtype=dtype, eps=1e-6, stacked=False,
                              own_values=True, value_norm=False, rot=128, rope="base",
                              base=1_000_000.0, offsets=[off], seed=off + 1))
        # gemma4-12b sliding: 16 / 8 heads of 256, base 10,000, V normed; stacked.
        cases.append(dict(name=f"gemma4-12b sliding {tag} stacked", rows=1, heads=16, kv_heads=8,
                          head_dim=256, dtype=dtype, eps=1e-6, stacked=True, own_values=True,
                          value_norm=True, rot=256, rope="base", base=10_000.0, offsets=[700],
                          seed=7))
        # gemma4-12b global: 16 / 4 heads of 512, proportional RoPE (a quarter
        # rotated), V is K's projection.
        cases.append(dict(name=f"gemma4-12b global {tag} k=v", rows=1, heads=16, kv_heads=4,
                          head_dim=512, dtype=dtype, eps=1e-6, stacked=False, own_values=False,
                          value_norm=True, rot=512, rope="periods",
                          periods=proportional_periods(512, 128, 1_000_000.0), offsets=[3000],
                          seed=9))
        # A batch: one offset per row, a linear-scaled base RoPE, partial rotation.
        cases.append(dict(name=f"batch of 4 {tag} per-row offsets", rows=4, heads=8, kv_heads=2,
                          head_dim=64, dtype=dtype, eps=1e-5, stacked=True, own_values=True,
                          value_norm=False, rot=32, rope="base", base=10_000.0, scale=0.25,
                          offsets=[0, 9, 260, 5000], seed=11))
    failed = [c["name"] for c in cases if not check(src, c, a.max_ulp)]
    print(f"head-kernel: {len(cases) - len(failed)} of {len(cases)} cases within {a.max_ulp} ulp",
          flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
