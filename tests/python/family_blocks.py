"""Run the blocks of the qwen2 / gemma2 / qwen3_moe / minicpm / granite / phi3 / olmo2 / lfm2 / glm4_moe / deepseek_v3 families with
mlx-lm 0.32.2's own modules, on the inputs and weights that
tests/family_blocks.rs wrote, so the Rust test can compare raw bytes.

Usage: family_blocks.py IN.safetensors CASES.json OUT.safetensors

Each case of CASES.json names a block and its parameters. Its tensors in IN
are `<case>/<param>` (a parameter path of the mlx-lm module, loaded with
`load_weights(strict=True)`, so Rust must supply exactly the module's
parameters) and `<case>/@<input>` (activations, ids, masks). Its outputs go to
OUT as `<case>/<output>`.

Where a block is a few lines inside a bigger module (the embedding scales, the
final softcap, minicpm's residual and logit scales), the bigger module runs
with its other submodules replaced by stand-ins that return the given tensors,
so the lines that run are mlx-lm's own.
"""
import json
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import (deepseek_v3, gemma2, gemma3_text, glm4_moe, gpt_oss, granite, lfm2,
                            minicpm, olmo2, phi3, qwen3_moe)
from mlx_lm.models.base import create_attention_mask, create_causal_mask, create_ssm_mask
from mlx_lm.models.cache import ArraysCache, KVCache
from mlx_lm.models.rope_utils import initialize_rope

import compat

compat.apply()  # quantized SwitchGLU's gather_qmm keyword (see compat.py)

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


def quantized(module, case, predicate=None):
    """Quantize as mlx_lm.convert does (the model's quant_predicate), if asked.
    nn.quantize swaps submodules only, so a lone Linear / Embedding becomes its
    quantized form through its own to_quantized."""
    q = case.get("quant")
    if q is None:
        return module
    if hasattr(module, "to_quantized"):
        return module.to_quantized(group_size=q["group_size"], bits=q["bits"])
    nn.quantize(module, group_size=q["group_size"], bits=q["bits"],
                class_predicate=predicate)
    return module


def loaded(module, case, params, predicate=None):
    module = quantized(module, case, predicate)
    module.load_weights(params, strict=True)
    return module


def gemma2_args(c, layers=1):
    return gemma2.ModelArgs(
        model_type="gemma2", hidden_size=c["hidden"], num_hidden_layers=layers,
        intermediate_size=c.get("intermediate", 1),
        num_attention_heads=c.get("heads", 1), head_dim=c.get("head_dim", 1),
        rms_norm_eps=c.get("eps", 1e-6), vocab_size=c.get("vocab", 1),
        num_key_value_heads=c.get("kv_heads", 1), rope_theta=c.get("rope_theta", 10000),
        attn_logit_softcapping=c.get("attn_softcap", 50.0),
        final_logit_softcapping=c.get("final_softcap", 30.0),
        query_pre_attn_scalar=c.get("query_pre_attn_scalar", 144.0))


def minicpm_args(c, layers):
    return minicpm.ModelArgs(
        model_type="minicpm", hidden_size=c["hidden"], dim_model_base=c.get("dim_model_base", 1),
        num_hidden_layers=layers, intermediate_size=c.get("intermediate", 1),
        num_attention_heads=c.get("heads", 1), rms_norm_eps=1e-6,
        vocab_size=c.get("vocab", 1), num_key_value_heads=c.get("heads", 1),
        scale_depth=c.get("scale_depth", 1.0), scale_emb=c.get("scale_emb", 1.0))


def granite_args(c, layers=0):
    """granite.ModelArgs has no defaults but rope_scaling and the tie."""
    return granite.ModelArgs(
        model_type="granite", hidden_size=c["hidden"], num_hidden_layers=layers,
        intermediate_size=c.get("intermediate", 1), num_attention_heads=c.get("heads", 1),
        rms_norm_eps=c.get("eps", 1e-5), vocab_size=c.get("vocab", 1),
        logits_scaling=c.get("logits_scaling", 1.0),
        attention_multiplier=c.get("attention_multiplier", 1.0),
        embedding_multiplier=c.get("embedding_multiplier", 1.0),
        residual_multiplier=c.get("residual_multiplier", 1.0),
        max_position_embeddings=4096, num_key_value_heads=c.get("heads", 1),
        attention_bias=False, mlp_bias=False, rope_theta=10000.0,
        tie_word_embeddings=c.get("tied", True))


def phi3_args(c):
    """phi3.ModelArgs: head_dim is hidden_size // heads; rope_scaling None."""
    return phi3.ModelArgs(
        model_type="phi3", hidden_size=c["hidden"], num_hidden_layers=1,
        intermediate_size=1, num_attention_heads=c["heads"], rms_norm_eps=1e-5,
        vocab_size=1, num_key_value_heads=c["kv_heads"], rope_theta=c["rope_theta"])
def olmo2_args(c):
    return olmo2.ModelArgs(
        model_type="olmo2", hidden_size=c["hidden"], num_hidden_layers=1,
        intermediate_size=c["intermediate"], num_attention_heads=c["heads"],
        rms_norm_eps=c["eps"], vocab_size=1, head_dim=c["head_dim"],
        num_key_value_heads=c["kv_heads"], rope_theta=c["rope_theta"])


def lfm2_args(c):
    return lfm2.ModelArgs(
        model_type="lfm2", vocab_size=1, hidden_size=c["hidden"], num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=1,
        norm_eps=1e-5, conv_bias=False, conv_L_cache=c["kernel"], block_dim=c["hidden"],
        block_multiple_of=1, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False,
        block_ff_dim=1, full_attn_idxs=[])


def identity(x, *args, **kwargs):
    return x


class HiddenStates:
    """Stands in for a model body: returns the given hidden states."""

    def __init__(self, h, embed_tokens=None):
        self.h = h
        self.embed_tokens = embed_tokens

    def __call__(self, inputs, cache=None):
        return self.h


def run(case):
    name, block = case["name"], case["block"]
    params, x = tensors_of(name)
    if block == "linear_bias":
        m = loaded(nn.Linear(case["in"], case["out"], bias=True), case, params)
        return {"y": m(x["x"])}
    if block == "gemma2_norm":
        m = loaded(gemma2.RMSNorm(case["hidden"], eps=case["eps"]), case, params)
        return {"y": m(x["x"])}
    if block == "gemma2_mlp":
        m = loaded(gemma2.MLP(case["hidden"], case["intermediate"]), case, params)
        return {"y": m(x["x"])}
    if block == "gemma2_attention":
        m = loaded(gemma2.Attention(gemma2_args(case)), case, params)
        h = x["x"]
        if case["mode"] == "additive":
            return {"y": m(h, x["mask"], None)}
        # As mlx-lm generates: a KVCache, a prefill with the bool mask of
        # create_attention_mask(return_array=True), one-token steps without
        # a mask, then a chunk at an offset.
        cache = KVCache()
        p = case["prefill"]
        y0 = m(h[:, :p], cache.make_mask(p, return_array=True, window_size=None), cache)
        y1 = m(h[:, p:p + 1], cache.make_mask(1, return_array=True, window_size=None), cache)
        n = h.shape[1] - p - 1
        y2 = m(h[:, p + 1:], cache.make_mask(n, return_array=True, window_size=None), cache)
        return {"prefill": y0, "step": y1, "chunk": y2}
    if block == "qwen3_moe":
        args = qwen3_moe.ModelArgs(
            model_type="qwen3_moe", hidden_size=case["hidden"], num_hidden_layers=1,
            intermediate_size=1, num_attention_heads=1, num_experts=case["experts"],
            num_experts_per_tok=case["top_k"], decoder_sparse_step=1, mlp_only_layers=[],
            moe_intermediate_size=case["intermediate"], rms_norm_eps=1e-6, vocab_size=1,
            num_key_value_heads=1, head_dim=1, rope_theta=1e6, tie_word_embeddings=False,
            max_position_embeddings=1, norm_topk_prob=case["norm_topk_prob"])
        model = qwen3_moe.Model(args)
        # The model's own quant_predicate (mlp.gate at 8 bits, group 64).
        pred = model.quant_predicate

        def predicate(path, module):
            return hasattr(module, "to_quantized") and pred(path, module)

        block_module = qwen3_moe.Qwen3MoeSparseMoeBlock(args)
        # The paths the predicate sees in a model: model.layers.N.mlp.<name>.
        m = loaded(block_module, case, params,
                   lambda path, mod: predicate("model.layers.0.mlp." + path, mod))
        return {"y": m(x["x"])}
    if block == "gpt_oss_mlp":
        # gpt_oss.MLPBlock quantized by gpt_oss.Model's own quant_predicate
        # (router at 8 bits, group 64); mxfp4 experts as mlx-community's
        # MXFP4-Q8 conversion writes them.
        args = gpt_oss.ModelArgs(
            model_type="gpt_oss", hidden_size=case["hidden"],
            intermediate_size=case["intermediate"], num_local_experts=case["experts"],
            num_experts_per_tok=case["top_k"], num_hidden_layers=2, vocab_size=1)
        own = gpt_oss.Model.quant_predicate.fget(None)
        mxfp4 = {"group_size": 32, "bits": 4, "mode": "mxfp4"}

        def predicate(path, module):
            if not hasattr(module, "to_quantized"):
                return False
            if case["experts_mxfp4"] and path.startswith("experts."):
                return dict(mxfp4)
            return own(path, module)

        m = loaded(gpt_oss.MLPBlock(args), case, params, predicate)
        return {"y": m(x["x"])}
    if block == "glm4_moe":
        # glm4_moe.MoE as its DecoderLayer builds it past first_k_dense_replace;
        # nn.quantize visits its Linear and SwitchLinear modules only (MoEGate
        # holds a plain weight), as mlx_lm.convert does.
        args = glm4_moe.ModelArgs(
            model_type="glm4_moe", vocab_size=1, hidden_size=case["hidden"],
            intermediate_size=1, max_position_embeddings=1,
            moe_intermediate_size=case["intermediate"], norm_topk_prob=case["norm_topk_prob"],
            num_attention_heads=1, n_group=case["n_group"], head_dim=2,
            topk_group=case["topk_group"], n_shared_experts=case["n_shared"],
            n_routed_experts=case["experts"],
            routed_scaling_factor=case["routed_scaling_factor"],
            num_experts_per_tok=case["top_k"], first_k_dense_replace=0, num_hidden_layers=1,
            num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=1e6, rope_scaling=None,
            use_qk_norm=False, tie_word_embeddings=False, attention_bias=False,
            partial_rotary_factor=1.0)
        m = loaded(glm4_moe.MoE(args), case, params)
        return {"y": m(x["x"])}
    if block == "gemma2_embed":
        m = gemma2.GemmaModel(gemma2_args(case, layers=0))
        m.norm = identity
        loaded(m, case, params)
        # No layers, so no cache list of its own: hand it one entry.
        return {"h": m(x["ids"], cache=[None])}
    if block == "gemma3_embed":
        # No layers: a pattern of 1 makes no sliding mask, and the full
        # layers' mask reads cache[0] of the one-entry list handed in.
        m = gemma3_text.Gemma3Model(gemma3_text.ModelArgs(
            model_type="gemma3_text", hidden_size=case["hidden"], num_hidden_layers=0,
            vocab_size=case["vocab"], sliding_window_pattern=1))
        m.norm = identity
        loaded(m, case, params)
        return {"h": m(x["ids"], cache=[None])}
    if block == "gemma3_linear_rope":
        # gemma3_text's full layers: initialize_rope with the linear scaling.
        rope = initialize_rope(case["dims"], base=case["theta"], traditional=False,
                               scaling_config={"rope_type": "linear", "factor": case["factor"]})
        return {"y": rope(x["x"], offset=case["offset"])}
    if block == "yarn_rope":
        rope = initialize_rope(case["dims"], base=case["theta"], traditional=case["traditional"],
                               scaling_config=case["scaling"])
        return {"freqs": rope._freqs, "y": rope(x["x"], offset=case["offset"])}
    if block == "gemma2_final":
        m = gemma2.Model(gemma2_args(case, layers=0))
        embed = loaded(nn.Embedding(case["vocab"], case["hidden"]), case, params)
        m.model = HiddenStates(x["h"], embed)
        return {"logits": m(None)}
    if block == "minicpm_embed":
        m = minicpm.MiniCPMModel(minicpm_args(case, layers=0))
        m.norm = identity
        loaded(m, case, params)
        # No layers, so no cache list of its own: hand it one entry.
        return {"h": m(x["ids"], cache=[None])}
    if block == "minicpm_residual":
        layer = minicpm.DecoderLayer(minicpm_args(case, layers=case["num_layers"]))
        layer.input_layernorm = identity
        layer.post_attention_layernorm = identity
        layer.self_attn = lambda h, mask=None, cache=None: x["r_attn"]
        layer.mlp = lambda h: x["r_mlp"]
        return {"out": layer(x["x"])}
    if block == "minicpm_logits":
        m = minicpm.Model(minicpm_args(case, layers=0))
        m.model = HiddenStates(x["h"])
        loaded(m, case, params)
        return {"logits": m(None)}
    if block == "granite_residual":
        layer = granite.TransformerBlock(granite_args(case))
        layer.input_layernorm = identity
        layer.post_attention_layernorm = identity
        layer.self_attn = lambda h, mask=None, cache=None: x["r_attn"]
        layer.mlp = lambda h: x["r_mlp"]
        return {"out": layer(x["x"])}
    if block == "granite_logits":
        # granite.Model.__call__ on the normed hidden states: the body's own
        # final RMSNorm, then the head and `/ logits_scaling`.
        m = loaded(granite.Model(granite_args(case)), case, params)
        body = m.model
        m.model = HiddenStates(body.norm(x["h"]), body.embed_tokens)
        return {"logits": m(None)}
    if block == "phi3_mlp":
        m = loaded(phi3.MLP(case["hidden"], case["intermediate"]), case, params)
        return {"y": m(x["x"])}
    if block == "phi3_attention":
        # As phi3.Phi3Model runs a layer: create_attention_mask(h, cache)
        # ("causal" for a chunk, None for one token), then the layer.
        m = loaded(phi3.Attention(phi3_args(case)), case, params)
        h, cache, p = x["x"], KVCache(), case["prefill"]
        ys = []
        for part in (h[:, :p], h[:, p:p + 1], h[:, p + 1:]):
            ys.append(m(part, create_attention_mask(part, cache), cache))
        return {"prefill": ys[0], "step": ys[1], "chunk": ys[2]}
    if block == "olmo2_block":
        # olmo2.TransformerBlock as LlamaModel runs it: a KVCache, the mask of
        # create_attention_mask(h, cache) ("causal" or None), a prefill, one
        # token, then a chunk at an offset.
        m = loaded(olmo2.TransformerBlock(olmo2_args(case)), case, params)
        h, p = x["x"], case["prefill"]
        cache = KVCache()
        outs = {}
        for key, part in [("prefill", h[:, :p]), ("step", h[:, p:p + 1]), ("chunk", h[:, p + 1:])]:
            outs[key] = m(part, create_attention_mask(part, cache), cache)
        return outs
    if block == "deepseek_mla":
        # DeepseekV3Attention with its KVCache and the mask DeepseekV3Model
        # makes (create_attention_mask(h, cache, return_array=True)): a
        # prefill, one token, then a chunk.
        args = deepseek_v3.ModelArgs(
            model_type="deepseek_v3", vocab_size=1, hidden_size=case["hidden"],
            intermediate_size=1, moe_intermediate_size=1, num_hidden_layers=1,
            num_attention_heads=case["heads"], num_key_value_heads=case["heads"],
            kv_lora_rank=case["rank"], q_lora_rank=case["q_lora"],
            qk_rope_head_dim=case["rope"], v_head_dim=case["v"], qk_nope_head_dim=case["nope"],
            max_position_embeddings=163840, rope_theta=case["rope_theta"],
            rope_scaling=case["rope_scaling"])
        m = loaded(deepseek_v3.DeepseekV3Attention(args), case, params)
        h, p = x["x"], case["prefill"]
        cache = KVCache()
        outs = {}
        for key, part in [("prefill", h[:, :p]), ("step", h[:, p:p + 1]), ("chunk", h[:, p + 1:])]:
            outs[key] = m(part, create_attention_mask(part, cache, return_array=True), cache)
        return outs
    if block == "lfm2_short_conv":
        # lfm2.ShortConv with its ArraysCache(size=1), the mask as
        # Lfm2Model makes it (create_ssm_mask): one sequence (prefill, one
        # token, chunk), then a batch as BatchGenerator prefills it (merge of
        # empty caches, prepare(lengths) for right padding, finalize) and a step.
        m = loaded(lfm2.ShortConv(lfm2_args(case), 0), case, params)
        h, p = x["x"], case["prefill"]
        cache = ArraysCache(1)
        outs = {}
        for key, part in [("prefill", h[:, :p]), ("step", h[:, p:p + 1]), ("chunk", h[:, p + 1:])]:
            outs[key] = m(part, mask=create_ssm_mask(part, cache), cache=cache)
        hb, t = x["xb"], case["batch_tokens"]
        batch = ArraysCache.merge([ArraysCache(1), ArraysCache(1)])
        batch.prepare(lengths=case["lengths"])
        outs["batch_prefill"] = m(hb[:, :t], mask=batch.make_mask(t), cache=batch)
        batch.finalize()
        outs["batch_step"] = m(hb[:, t:], mask=batch.make_mask(1), cache=batch)
        return outs
    raise SystemExit(f"family_blocks.py: unknown block {block!r} in case {name!r}")


for case in cases:
    for k, v in run(case).items():
        out[f"{case['name']}/{k}"] = v
mx.eval(out)
mx.save_safetensors(sys.argv[3], out)
