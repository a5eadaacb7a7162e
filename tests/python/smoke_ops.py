"""Recompute the runtime smoke ops with Python mlx on the inputs the Rust test
wrote, so the test can compare raw bytes. Usage: smoke_ops.py IN OUT."""
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.rope_utils import Llama3RoPE

inp = mx.load(sys.argv[1])
out = {}
for dt in ("f32", "bf16"):
    a, b = inp[f"a_{dt}"], inp[f"b_{dt}"]
    out[f"matmul_{dt}"] = a @ b
    x, w = inp[f"x_{dt}"], inp[f"w_{dt}"]
    out[f"rms_norm_{dt}"] = mx.fast.rms_norm(x, w, 1e-6)
    r = inp[f"r_{dt}"]
    out[f"rope_base_{dt}"] = mx.fast.rope(r, 32, traditional=False, base=10000.0, scale=1.0, offset=3)
    out[f"rope_freqs_{dt}"] = mx.fast.rope(
        r, 32, traditional=False, base=None, scale=1.0, offset=mx.array(3), freqs=inp["freqs"]
    )
    q, k, v = inp[f"q_{dt}"], inp[f"k_{dt}"], inp[f"v_{dt}"]
    out[f"sdpa_causal_{dt}"] = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0, mask="causal")
    g, u = inp[f"g_{dt}"], inp[f"u_{dt}"]
    geglu = mx.compile(lambda gate, x: nn.gelu_approx(gate) * x, shapeless=True)
    out[f"compiled_geglu_{dt}"] = geglu(g, u)
    out[f"eager_geglu_{dt}"] = nn.gelu_approx(g) * u
    out[f"swiglu_{dt}"] = swiglu(g, u)
# Llama-3.2's rope_scaling, at two head dims (all three frequency bands).
for dims in (32, 64):
    rope = Llama3RoPE(dims, max_position_embeddings=131072, traditional=False, base=500000.0,
                      scaling_config={"factor": 32.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192})
    out[f"llama3_freqs_{dims}"] = rope._freqs
for bits in (4, 8):
    wq, scales, biases = mx.quantize(inp["qw_f32"], group_size=64, bits=bits)
    out[f"quantize{bits}_w"], out[f"quantize{bits}_scales"], out[f"quantize{bits}_biases"] = wq, scales, biases
    for dt in ("f32", "bf16"):
        s, bi = scales.astype(inp[f"qx_{dt}"].dtype), biases.astype(inp[f"qx_{dt}"].dtype)
        out[f"qmm{bits}_{dt}"] = mx.quantized_matmul(
            inp[f"qx_{dt}"], wq, s, bi, transpose=True, group_size=64, bits=bits
        )
mx.save_safetensors(sys.argv[2], out)
