"""Do MLX CUDA kernels give different bits for the same values at different
buffer addresses? (docs/parity.md, "On the GPU"). Each op runs on the same
values placed at element offsets 0..7 of a larger buffer (a contiguous slice,
so no copy realigns it), bf16, shapes of a Gemma-4 decode step; prints, per
op, how many distinct results the offsets gave (1 = address-independent).

Each op runs in its own process (a CUDA fault ends only that one), first at
element offsets 0..7, then at offsets 0, 8, 16, 24 (16-byte steps).

Usage: python3 align_probe.py   (GPU machine, mlx-cuda-13 0.32.2)
"""

import subprocess
import sys

import mlx.core as mx


def at(a: mx.array, off: int) -> mx.array:
    """`a`'s values in a fresh buffer, starting `off` elements in."""
    flat = a.reshape(-1)
    pad = mx.zeros((off,), dtype=a.dtype)
    tail = mx.zeros((8,), dtype=a.dtype)
    big = mx.concatenate([pad, flat, tail])
    mx.eval(big)
    return big[off:off + flat.size].reshape(a.shape)


OFFSETS = range(8)


def distinct(f, *args) -> int:
    outs = []
    for off in OFFSETS:
        moved = [at(x, off) if i == 0 else x for i, x in enumerate(args)]
        y = f(*moved)
        mx.eval(y)
        outs.append(bytes(memoryview(y.view(mx.uint16) if y.dtype == mx.bfloat16 else y)))
    return len(set(outs))


def main() -> None:
    if len(sys.argv) == 1:
        for step in ("1", "16"):
            for i in range(11):
                r = subprocess.run([sys.executable, __file__, step, str(i)], capture_output=True, text=True)
                err = r.stderr.strip().splitlines()
                line = r.stdout.strip() or (f"FAILED: {err[-1]}" if err else "no output")
                print(f"offsets step {step}: {line[:200]}", flush=True)
        return
    global OFFSETS
    OFFSETS = range(8) if sys.argv[1] == "1" else range(0, 32, 8)
    only = int(sys.argv[2])
    count = iter(range(100))

    def print_(label, run):
        if next(count) == only:
            print(label, run())
    mx.random.seed(3)
    H, N, G = 3840, 4096, 64
    x = (mx.random.normal((1, 1, H)) * 2).astype(mx.bfloat16)
    w = (mx.random.normal((N, H)) / H ** 0.5).astype(mx.bfloat16)
    wq, s, b = mx.quantize(w, group_size=G, bits=4)
    nw = mx.random.uniform(0.5, 1.5, (H,)).astype(mx.bfloat16)
    mx.eval(x, w, wq, s, b, nw)
    print_("align quantized_matmul M=1 (qmv):", lambda: distinct(lambda x: mx.quantized_matmul(x, wq, s, b, True, G, 4), x))
    x24 = (mx.random.normal((1, 24, H)) * 2).astype(mx.bfloat16)
    print_("align quantized_matmul M=24:", lambda: distinct(lambda x: mx.quantized_matmul(x, wq, s, b, True, G, 4), x24))
    print_("align matmul bf16 M=1:", lambda: distinct(lambda x: x @ w.T, x))
    print_("align rms_norm weight:", lambda: distinct(lambda x: mx.fast.rms_norm(x, nw, 1e-6), x))
    xh = (mx.random.normal((1, 1, 16, 256)) * 2).astype(mx.bfloat16)
    print_("align rms_norm no weight (head dim 256):", lambda: distinct(lambda x: mx.fast.rms_norm(x, None, 1e-6), xh))
    sc = (mx.random.normal((1, 16, 1, 700)) * 3).astype(mx.bfloat16)
    print_("align softmax precise:", lambda: distinct(lambda x: mx.softmax(x, axis=-1, precise=True), sc))
    k = (mx.random.normal((1, 8, 700, 256))).astype(mx.bfloat16)
    q = (mx.random.normal((1, 8, 2, 256))).astype(mx.bfloat16)
    print_("align matmul q@k^T:", lambda: distinct(lambda q: q @ k.swapaxes(-1, -2), q))
    p = mx.softmax(sc.reshape(1, 8, 2, 700), axis=-1)
    print_("align matmul p@v:", lambda: distinct(lambda p: p @ k, p))
    print_("align sdpa:", lambda: distinct(lambda q: mx.fast.scaled_dot_product_attention(q, k, k, scale=1.0), q))
    e = mx.random.normal((1, 1, H)).astype(mx.bfloat16)
    print_("align gelu_approx*x:", lambda: distinct(lambda g: mx.compile(lambda a, c: (0.5 * a * (1 + mx.tanh(0.7978845608 * (a + 0.044715 * a ** 3)))) * c)(g, e), x))
    print_("align sum:", lambda: distinct(lambda x: x.astype(mx.float32).sum(-1), x))


if __name__ == "__main__":
    main()
