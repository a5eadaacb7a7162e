"""Which part of a decoder layer changes bits when `mx.compile` fuses it on CUDA?

On the H200 the compiled GPU decode path (runtime/core/src/decode.rs,
`Path::NativeFastOps`) changed Gemma-2 and Gemma-4 decode logits and no
SiLU family's (docs/parity.md, "On the GPU"). That path compiles the ops of a
layer after attention (o_proj, the residuals, the norms, the MLP, the layer
scalar, the PLE gate) as one function, with MLX's fast ops left as single
primitives. This probe does the same with mlx-lm's own modules, on a
checkpoint that `archgen init` made: for layer 0 of each model, the
post-attention half exactly as mlx-lm's decoder layer writes it, run

  * eagerly on [1, 1, hidden] (mlx-lm's decode step),
  * eagerly on [1, hidden] rows (the GPU path's form),
  * inside one `mx.compile`, on [1, 1, hidden] and on rows,
  * with only its MLP (`mlp(pre_norm(h))`) compiled,
  * with only its MLP's activation region compiled around mlx-lm's own
    compiled helper (what a nested compile inlines),

and prints, per variant, how many output elements differ from the eager
[1, 1, hidden] run. A variant with differing elements names what changes
bits; SiLU models (Qwen3) are the control. On the CPU every line is 0.

Usage: block_probe.py MODEL_DIR... (checkpoints from `archgen init`).
"""

from __future__ import annotations

import sys

import mlx.core as mx
from mlx_lm.utils import load_model


def post_gemma4(layer, x, a, ple=None):
    # gemma4_text.DecoderLayer.__call__ after self_attn (o_proj is its last op)
    h = layer.self_attn.o_proj(a)
    h = layer.post_attention_layernorm(h)
    h = x + h
    residual = h
    h = layer.pre_feedforward_layernorm(h)
    h = layer.mlp(h)
    h = layer.post_feedforward_layernorm(h)
    h = residual + h
    if ple is not None and layer.per_layer_input_gate is not None:
        import mlx.nn as nn
        residual = h
        gate = layer.per_layer_input_gate(h)
        gate = nn.gelu_approx(gate)
        gate = mx.multiply(gate, ple)
        gate = layer.per_layer_projection(gate)
        gate = layer.post_per_layer_input_norm(gate)
        h = residual + gate
    if layer.layer_scalar is not None:
        h = h * layer.layer_scalar
    return h


def post_gemma2(layer, x, a):
    # gemma2.TransformerBlock.__call__ after self_attn
    r = layer.self_attn.o_proj(a)
    h = x + layer.post_attention_layernorm(r)
    r = layer.mlp(layer.pre_feedforward_layernorm(h))
    return h + layer.post_feedforward_layernorm(r)


def post_qwen(layer, x, a):
    # qwen3.TransformerBlock.__call__ after self_attn
    h = x + layer.self_attn.o_proj(a)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def pre_ffn_norm(layer):
    return getattr(layer, "pre_feedforward_layernorm", None) or layer.post_attention_layernorm


def probe(model_dir: str) -> None:
    model, config = load_model(__import__("pathlib").Path(model_dir))
    text = config.get("text_config", config)
    kind = config["model_type"]
    if kind.startswith("gemma4"):
        post = post_gemma4
    elif kind == "gemma2":
        post = post_gemma2
    else:
        post = post_qwen
    layer = model.layers[0]
    hidden = text["hidden_size"]
    heads, head_dim = text["num_attention_heads"], text.get("head_dim") or hidden // text["num_attention_heads"]
    dtype = layer.self_attn.o_proj.weight.dtype if hasattr(layer.self_attn.o_proj, "weight") else mx.bfloat16
    if dtype == mx.uint32:  # quantized: the activations are in the scales' dtype
        dtype = layer.self_attn.o_proj.scales.dtype
    mx.random.seed(3)
    x3 = mx.random.normal((1, 1, hidden)).astype(dtype)
    a3 = mx.random.normal((1, 1, heads * head_dim)).astype(dtype)
    x2, a2 = x3.reshape(1, hidden), a3.reshape(1, heads * head_dim)
    mx.eval(x3, a3, x2, a2)
    ple_width = text.get("hidden_size_per_layer_input") or 0
    if post is post_gemma4 and ple_width:
        ple = mx.random.normal((1, 1, ple_width)).astype(dtype)
        mx.eval(ple)
        base = post

        def post(layer, x, a):  # noqa: F811 -- the PLE input rides along
            p = ple if x.ndim == 3 else ple.reshape(1, -1)
            return base(layer, x, a, p)

    def run(f, *args):
        out = f(*args)
        mx.eval(out)
        return out.reshape(-1)

    reference = run(lambda x, a: post(layer, x, a), x3, a3)

    def mlp_compiled(x, a):
        # the post half with only mlp(pre_ffn_norm(h)) inside a compile: run
        # by swapping the layer's mlp for a compiled wrapper
        saved = layer.mlp
        inner = saved
        compiled = mx.compile(lambda h: inner(h))

        class Wrapped:
            def __call__(self, h):
                return compiled(h)
        layer.mlp = Wrapped()
        try:
            return post(layer, x, a)
        finally:
            layer.mlp = saved

    variants = {
        "eager rows [1, hidden]": lambda: run(lambda x, a: post(layer, x, a), x2, a2),
        "compiled [1, 1, hidden]": lambda: run(mx.compile(lambda x, a: post(layer, x, a)), x3, a3),
        "compiled rows": lambda: run(mx.compile(lambda x, a: post(layer, x, a)), x2, a2),
        "only the MLP compiled": lambda: run(mlp_compiled, x3, a3),
    }
    print(f"block probe {model_dir.rstrip('/').split('/')[-1]} ({kind}, {dtype}, hidden {hidden})", flush=True)
    bits = mx.uint32 if reference.dtype == mx.float32 else mx.uint16
    for name, f in variants.items():
        try:
            out = f()
            differ = (out.view(bits) != reference.view(bits)).sum().item()
            print(f"block probe   {name}: {differ} of {reference.size} differ from eager", flush=True)
        except Exception as e:  # report and go on: one probe per line
            print(f"block probe   {name}: error {type(e).__name__}: {e}", flush=True)




def stacking_probe() -> None:
    """Does one matmul over stacked weights give each part's bits on CUDA?

    The CPU decode path stacks Q/K/V (and could stack gate/up) into one
    projection and splits the rows after (decode.rs `FusedQkv`): fewer, larger
    matrix-vector products. On the CPU each output is the same dot product
    either way; on CUDA the kernel is picked by shape, so this measures it
    for one-token rows at real widths, bf16 and 4-bit (group 64).
    """
    mx.random.seed(5)
    cases = {
        # name: (hidden, [rows of each stacked part])
        "gemma4-12b q/k/v (sliding)": (3840, [4096, 2048, 2048]),
        "gemma4-12b gate/up": (3840, [15360, 15360]),
        "qwen3-8b q/k/v": (4096, [4096, 1024, 1024]),
        "qwen3-8b gate/up": (4096, [12288, 12288]),
    }
    for name, (hidden, parts) in cases.items():
        x = mx.random.normal((1, hidden)).astype(mx.bfloat16)
        ws = [(0.02 * mx.random.normal((n, hidden))).astype(mx.bfloat16) for n in parts]
        mx.eval(x, *ws)
        stacked = mx.concatenate(ws, axis=0)
        mx.eval(stacked)
        for form in ("bf16", "q4"):
            if form == "bf16":
                alone = [x @ w.T for w in ws]
                together = x @ stacked.T
            else:
                qs = [mx.quantize(w, group_size=64, bits=4) for w in ws]
                qstack = mx.quantize(stacked, group_size=64, bits=4)
                alone = [mx.quantized_matmul(x, *q, transpose=True, group_size=64, bits=4) for q in qs]
                together = mx.quantized_matmul(x, *qstack, transpose=True, group_size=64, bits=4)
            mx.eval(*alone, together)
            offsets, start = [], 0
            for n in parts:
                offsets.append((start, start + n))
                start += n
            differ = sum((together[:, a:b].view(mx.uint16) != y.view(mx.uint16)).sum().item()
                         for (a, b), y in zip(offsets, alone))
            print(f"stacking probe {name} {form}: {differ} of {sum(parts)} differ "
                  "(one stacked matmul against one per part)", flush=True)


if __name__ == "__main__":
    print(f"mlx {mx.__version__} on {mx.default_device()}", flush=True)
    for d in sys.argv[1:]:
        probe(d)
    stacking_probe()
