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

Then the glue probe: the decode blocks' fused glue as mlx-lm computes it
eagerly (its own compiled helpers as they are) against the same ops traced
inside one enclosing `mx.compile`, as the GPU decode path runs them
(runtime/core/src/decode.rs, `Path::NativeFastOps`), on bf16 rows of real
width. On the H200 that path changed Gemma-2 and Gemma-4 decode bits and no
SiLU family's (docs/parity.md, "On the GPU"); a glue line with differing
elements names the op. One line per case: `glue probe NAME: K of N differ`.
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


def glue_probe() -> None:
    import mlx.nn as nn
    from mlx_lm.models.activations import swiglu
    from mlx_lm.models.gemma4_text import geglu

    mx.random.seed(11)
    width, inter, eps = 3840, 15360, 1e-6
    bf = mx.bfloat16
    r = lambda *shape: mx.random.normal(shape).astype(bf)  # noqa: E731
    h, a, f, pli = r(1, width), r(1, width), r(1, width), r(1, width)
    g, u = r(1, inter), r(1, inter)
    w1, w2, w3 = [1 + 0.1 * r(width) for _ in range(3)]
    scalar = mx.array([0.75], dtype=bf)
    mx.eval(h, a, f, pli, g, u, w1, w2, w3, scalar)
    norm = lambda x, w: mx.fast.rms_norm(x, w, eps)  # noqa: E731
    cases = {
        # Gemma-4: mlx-lm's compiled geglu, alone and inside a compile
        "gemma4 geglu (mlx-lm compiled) nested in a compile": (
            lambda: geglu(g, u), lambda g, u: geglu(g, u), (g, u)),
        # Gemma-2: nn.gelu_approx (compiled) then an eager `* up`
        "gemma2 gelu_approx(gate) * up": (
            lambda: nn.gelu_approx(g) * u, lambda g, u: nn.gelu_approx(g) * u, (g, u)),
        # Gemma-4 e2b/e4b PLE gate: gelu_approx then an eager multiply
        "gemma4 PLE gelu_approx(gate) * per_layer_input": (
            lambda: nn.gelu_approx(a) * pli, lambda a, p: nn.gelu_approx(a) * p, (a, pli)),
        # Gemma-4 attention residual into the pre-FFN norm
        "gemma4 h + norm(a) then norm": (
            lambda: norm(h + norm(a, w1), w2), lambda h, a: norm(h + norm(a, w1), w2), (h, a)),
        # Gemma-4 end of layer: (h + post_ffn_norm(f)) * layer_scalar
        "gemma4 (h + norm(f)) * layer_scalar": (
            lambda: (h + norm(f, w3)) * scalar, lambda h, f, s: (h + norm(f, w3)) * s,
            (h, f, scalar)),
        # Qwen/Llama: mlx-lm's compiled swiglu nested, and the residual add
        "qwen swiglu (mlx-lm compiled) nested in a compile": (
            lambda: swiglu(g, u), lambda g, u: swiglu(g, u), (g, u)),
        "qwen h + a": (lambda: h + a, lambda h, a: h + a, (h, a)),
    }
    for name, (eager, traced, args) in cases.items():
        e = eager()
        c = mx.compile(traced)(*args)
        mx.eval(e, c)
        differ = (e.view(mx.uint16) != c.view(mx.uint16)).sum().item()
        print(f"glue probe {name}: {differ} of {e.size} differ", flush=True)


if __name__ == "__main__":
    main()
    glue_probe()
