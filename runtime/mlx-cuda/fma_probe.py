"""Does MLX's CUDA compiler contract a multiply and an add into one FMA?

MLX CUDA compiles each fused elementwise region with NVRTC, whose default is
`--fmad=true`: `t = a * b; u = t + c` written as two statements may become one
fused multiply-add (one rounding instead of two), while the eager path runs
two kernels and rounds twice. The compiled decode blocks
(runtime/core/src/decode.rs) fuse elementwise glue on the GPU, so this probe
measures, on random data of several dtypes, whether `mx.compile` of such
expressions gives the same bits as running them eagerly.

Runs on the GPU machine (runtime/mlx-cuda/parity.sh, step `fma`). Prints one
line per expression and dtype: the number of elements (of 2**20) whose bits
differ between eager and compiled.
"""

import mlx.core as mx


def a_times_b_plus_c(a, b, c):
    return a * b + c


def c_plus_a_times_b(a, b, c):
    return c + a * b


def a_times_b_minus_c_times_a(a, b, c):
    return a * b - c * a


def residual_then_scale(a, b, c):
    # the end of a layer: (h + ffn) * layer_scalar
    return (a + b) * c


def rope_pair(a, b, c):
    # a RoPE fallback half: x1 * cos - x2 * sin
    return a * c - b * mx.sin(c)


def main() -> None:
    print(f"mlx {mx.__version__} on {mx.default_device()}", flush=True)
    n = 1 << 20
    mx.random.seed(7)
    keys = [mx.random.normal((n,)) for _ in range(3)]
    exprs = [a_times_b_plus_c, c_plus_a_times_b, a_times_b_minus_c_times_a,
             residual_then_scale, rope_pair]
    for dt in (mx.float32, mx.bfloat16, mx.float16):
        a, b, c = [k.astype(dt) for k in keys]
        mx.eval(a, b, c)
        for f in exprs:
            eager = f(a, b, c)
            compiled = mx.compile(f)(a, b, c)
            mx.eval(eager, compiled)
            bits = mx.uint32 if dt == mx.float32 else mx.uint16
            differ = (eager.view(bits) != compiled.view(bits)).sum().item()
            print(f"fma probe {f.__name__} {dt}: {differ} of {n} elements differ "
                  f"(eager vs mx.compile)", flush=True)


if __name__ == "__main__":
    main()
