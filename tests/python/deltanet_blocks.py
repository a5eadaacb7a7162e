"""Run the Qwen3.5 / Qwen3.6 blocks with mlx-lm 0.32.2's own modules
(qwen3_5.py, qwen3_next.py, gated_delta.py), on the inputs and weights that
tests/deltanet_blocks.rs wrote, so the Rust test can compare raw bytes.

Usage: deltanet_blocks.py IN.safetensors CASES.json OUT.safetensors

Each case of CASES.json names a block and its parameters. Its tensors in IN
are `<case>/<param>` (a parameter path of the mlx-lm module, loaded with
`load_weights(strict=True)`) and `<case>/@<input>`. Its outputs go to OUT as
`<case>/<output>`.

Intermediates of the Gated DeltaNet layer (what it hands gated_delta_update
and the gated norm) are recorded by wrappers that call mlx-lm's own function
and pass its result through unchanged.

Everything runs on the CPU, where mlx-lm takes the pure-ops recurrence
(`gated_delta_ops`: a loop over tokens of the compiled
`_gated_delta_step_ops`); the Metal kernels do not exist here.
"""
import dataclasses
import json
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gated_delta, qwen3_5, qwen3_next
from mlx_lm.models.base import create_attention_mask, create_ssm_mask
from mlx_lm.models.cache import ArraysCache, KVCache

import compat

compat.apply()  # quantized SwitchGLU's gather_qmm keyword (see compat.py)

assert mx.default_device() == mx.cpu, "the oracle must run mlx-lm's CPU path"

inp = mx.load(sys.argv[1])
with open(sys.argv[2]) as f:
    cases = json.load(f)
out = {}


def tensors_of(name):
    """(module params as (path, array) pairs, inputs by name) of one case."""
    p = name + "/"
    params, inputs = [], {}
    for k, v in inp.items():
        if not k.startswith(p):
            continue
        rest = k[len(p):]
        if rest.startswith("@"):
            inputs[rest[1:]] = v
        else:
            params.append((rest, v))
    return params, inputs


def qwen3_5_predicate(args, prefix):
    """qwen3_5's own quant_predicate (None for dense models: quantize every
    quantizable module), seen from `prefix` inside the model."""
    body = qwen3_5.TextModel(dataclasses.replace(args, num_hidden_layers=0))
    pred = body.quant_predicate

    def predicate(path, module):
        if not hasattr(module, "to_quantized"):
            return False
        return True if pred is None else pred(prefix + path, module)

    return predicate


def loaded(module, case, params, predicate=None):
    q = case.get("quant")
    if q is not None:
        nn.quantize(module, group_size=q["group_size"], bits=q["bits"],
                    class_predicate=predicate)
    module.load_weights(params, strict=True)
    module.eval()  # as mlx_lm.load leaves it
    return module


def chunks(x, sizes):
    start = 0
    for n in sizes:
        yield x[:, start:start + n]
        start += n


class Recorder:
    """Wraps gated_delta_update in a model module's namespace and a layer's
    gated norm: calls them unchanged and keeps what went in and came out."""

    def __init__(self, namespace):
        self.namespace = namespace
        self.seen = {}
        self.original = namespace.gated_delta_update

    def __enter__(self):
        def update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **kw):
            assert mask is None
            y, new_state = self.original(q, k, v, a, b, A_log, dt_bias, state, mask, **kw)
            self.seen.update(q=q, k=k, v=v, a=a, b=b, rec=y)
            return y, new_state

        self.namespace.gated_delta_update = update
        return self

    def __exit__(self, *exc):
        self.namespace.gated_delta_update = self.original

    def wrap_norm(self, layer):
        norm = layer.norm

        def gated_norm(x, gate=None):
            y = norm(x, gate)
            self.seen.update(z=gate, normed=y)
            return y

        layer.norm = gated_norm


def run_deltanet(case, params, x):
    if case["module"] == "qwen3_5":
        ns, args = qwen3_5, qwen3_5.TextModelArgs(**case["args"])
        m = qwen3_5.GatedDeltaNet(args)
        pred = qwen3_5_predicate(args, "model.layers.0.linear_attn.")
    else:
        ns, args = qwen3_next, qwen3_next.ModelArgs(**case["args"])
        m = qwen3_next.Qwen3NextGatedDeltaNet(args)
        pred = None
    loaded(m, case, params, pred)
    cache = ArraysCache(size=2)
    res = {}
    with Recorder(ns) as rec:
        rec.wrap_norm(m)
        for i, xi in enumerate(chunks(x["x"], case["chunks"])):
            mask = create_ssm_mask(xi, cache)
            res[f"c{i}/y"] = m(xi, mask, cache)
            res[f"c{i}/conv_state"] = cache[0]
            res[f"c{i}/state"] = cache[1]
            for k, v in rec.seen.items():
                res[f"c{i}/{k}"] = v
            mx.eval(res)
    return res


def run_recurrence(case, x):
    q, k = gated_delta.normalize_qk(x["q"], x["k"], inv_scale=x["q"].shape[-1] ** -0.5,
                                    eps=1e-6)
    y, state = gated_delta.gated_delta_update(
        q, k, x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], x.get("state"), None,
        use_kernel=True)
    return {"y": y, "state": state}


def run_attention(case, params, x):
    args = qwen3_5.TextModelArgs(**case["args"])
    m = loaded(qwen3_5.Attention(args), case, params,
               qwen3_5_predicate(args, "model.layers.3.self_attn."))
    cache = KVCache()
    res = {}
    for i, xi in enumerate(chunks(x["x"], case["chunks"])):
        res[f"c{i}/y"] = m(xi, create_attention_mask(xi, cache), cache)
    return res


def run_moe(case, params, x):
    args = qwen3_5.TextModelArgs(**case["args"])
    m = loaded(qwen3_5.SparseMoeBlock(args), case, params,
               qwen3_5_predicate(args, "model.layers.0.mlp."))
    return {"y": m(x["x"])}


def run_layer(case, params, x):
    args = qwen3_5.TextModelArgs(**case["args"])
    index = case["index"]
    layer = loaded(qwen3_5.DecoderLayer(args, index), case, params,
                   qwen3_5_predicate(args, f"model.layers.{index}."))
    cache = ArraysCache(size=2) if layer.is_linear else KVCache()
    res = {}
    for i, xi in enumerate(chunks(x["x"], case["chunks"])):
        # As Qwen3_5TextModel.__call__ makes the masks (from the cache before
        # the layer runs).
        if layer.is_linear:
            mask = create_ssm_mask(xi, cache)
        else:
            mask = create_attention_mask(xi, cache)
        res[f"c{i}/y"] = layer(xi, mask, cache)
        if layer.is_linear:
            res[f"c{i}/conv_state"] = cache[0]
            res[f"c{i}/state"] = cache[1]
        mx.eval(res)
    return res


def run_sanitize(case, x):
    config = case["config"]
    module = {"qwen3_5": qwen3_5, "qwen3_5_moe": __import__(
        "mlx_lm.models.qwen3_5_moe", fromlist=["Model"])}[config["model_type"]]
    model = module.Model(module.ModelArgs.from_dict(config))
    ckpt = {k[len("ckpt/"):]: v for k, v in x.items() if k.startswith("ckpt/")}
    sanitized = model.sanitize(dict(ckpt))
    # mlx_lm.convert's set_dtype (convert.py) with the model's cast_predicate.
    cast_predicate = getattr(model, "cast_predicate", lambda _: True)
    dtype = mx.bfloat16
    res = {}
    for k, v in sanitized.items():
        res[f"sanitized/{k}"] = v
        if cast_predicate(k) and mx.issubdtype(v.dtype, mx.floating):
            v = v.astype(dtype)
        res[f"converted/{k}"] = v
    return res


def run(case):
    name, block = case["name"], case["block"]
    params, x = tensors_of(name)
    if block == "deltanet":
        return run_deltanet(case, params, x)
    if block == "recurrence":
        return run_recurrence(case, x)
    if block == "gated_attention":
        return run_attention(case, params, x)
    if block == "moe":
        return run_moe(case, params, x)
    if block == "layer":
        return run_layer(case, params, x)
    if block == "sanitize":
        return run_sanitize(case, x)
    raise SystemExit(f"deltanet_blocks.py: unknown block {block!r} in case {name!r}")


for case in cases:
    for k, v in run(case).items():
        out[f"{case['name']}/{k}"] = v
    mx.eval(out)
mx.save_safetensors(sys.argv[3], out)
