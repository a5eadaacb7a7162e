"""Variants of a checkpoint and reference logits that the protocol does not
cover, for the runtime's loader and batch tests.

  variants.py hf-layout SRC DST
      Rewrite an mlx-community checkpoint (gemma4 wrapper layout) with the raw
      Hugging Face key names mlx-lm's sanitize accepts: `model.language_model.*`,
      fused `experts.gate_up_proj` / `experts.down_proj`, plus vision/audio
      tower tensors and rotary buffers that sanitize drops.
  variants.py family-hf-layout SRC DST
      Rewrite a qwen2 / llama / mistral / qwen3_moe / glm4_moe / deepseek_v3 /
      minicpm / qwen3_5 / qwen3_next checkpoint with the tensors its Hugging
      Face original has and mlx-lm's sanitize undoes (rotary tables, a tied
      lm_head, per-expert weights, glm4_moe's MTP layer, deepseek_v3's
      kv_b_proj, no minicpm lm_head; qwen3_5's conv layout, norm offsets, MTP
      and vision).
  variants.py batch DIR OUT IDS_JSON
      One forward of mlx-lm over a batch ([B, L] ids, fresh cache): logits
      [B, L, V] to OUT (safetensors key "logits").
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compat  # noqa: E402
from oracle_logits import load  # noqa: E402


def hf_layout(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    weights = {}
    for f in sorted(src.glob("model*.safetensors")):
        weights.update(mx.load(str(f)))
    out = {}
    fused = {}
    for k, v in weights.items():
        assert k.startswith("language_model.model."), k
        rest = k[len("language_model.model."):]
        if ".experts.switch_glu." in rest:
            base, leaf = rest.split(".experts.switch_glu.")
            if leaf == "down_proj.weight":
                out[f"model.language_model.{base}.experts.down_proj"] = v
            else:
                fused.setdefault(base, {})[leaf] = v
            continue
        out[f"model.language_model.{rest}"] = v
    for base, parts in fused.items():
        gate_up = mx.concatenate([parts["gate_proj.weight"], parts["up_proj.weight"]], axis=-2)
        out[f"model.language_model.{base}.experts.gate_up_proj"] = gate_up
    # Tensors that sanitize must drop.
    out["model.vision_tower.patch.weight"] = mx.zeros((2, 2))
    out["model.audio_tower.conv.weight"] = mx.zeros((2,))
    out["model.language_model.layers.0.self_attn.rotary_emb.inv_freq"] = mx.zeros((4,))
    mx.save_safetensors(str(dst / "model.safetensors"), out)


def family_hf_layout(src: Path, dst: Path) -> None:
    """An mlx-layout checkpoint of qwen2 / llama (mistral) / smollm3 / granite /
    qwen3_moe / minicpm rewritten as its Hugging Face original, which each
    family's sanitize turns back into the same model: rotary tables to drop
    and a tied lm_head to pop (qwen2, llama, smollm3; granite: the head only),
    per-expert weights to stack (qwen3_moe; glm4_moe, with its MTP layer to
    drop),
    no lm_head to copy from the embedding (minicpm)."""
    config = json.loads((src / "config.json").read_text())
    model_type = config["model_type"]
    weights = {}
    for f in sorted(src.glob("model*.safetensors")):
        weights.update(mx.load(str(f)))
    out = dict(weights)
    if model_type in ("qwen2", "llama", "mistral", "smollm3"):
        out["model.layers.0.self_attn.rotary_emb.inv_freq"] = mx.zeros((4,))
        if config.get("tie_word_embeddings", model_type in ("qwen2", "smollm3")):
            out["lm_head.weight"] = weights["model.embed_tokens.weight"]
    elif model_type == "granite":
        # granite.py's sanitize pops a tied lm_head only (no rotary tables).
        if config.get("tie_word_embeddings", True):
            out["lm_head.weight"] = weights["model.embed_tokens.weight"]
    elif model_type in ("qwen3_moe", "glm4_moe", "deepseek_v3", "kimi_k2"):
        if model_type in ("deepseek_v3", "kimi_k2"):
            # DeepSeek-V3's Hugging Face original: one kv_b_proj per layer
            # ([heads * (nope + v), rank]: per head the key rows, then the
            # value rows), which sanitize splits into embed_q (the key half
            # transposed) and unembed_out; rotary tables to drop.
            # A quantized checkpoint gets a kv_b_proj quantized with its bits
            # and group size (sanitize dequantizes, splits, quantizes again).
            q = config.get("quantization")
            for k in [k for k in weights if k.endswith(".self_attn.embed_q.weight")]:
                base = k[: -len(".embed_q.weight")]
                halves = []
                for name in ("embed_q", "unembed_out"):
                    w = out.pop(f"{base}.{name}.weight")
                    if f"{base}.{name}.scales" in weights:
                        w = mx.dequantize(w, out.pop(f"{base}.{name}.scales"),
                                          out.pop(f"{base}.{name}.biases"),
                                          group_size=q["group_size"], bits=q["bits"])
                    halves.append(w)
                kv = mx.concatenate([halves[0].swapaxes(-1, -2), halves[1]], axis=1)
                kv = kv.reshape(-1, kv.shape[-1])
                if f"{base}.embed_q.scales" in weights:
                    w, scales, biases = mx.quantize(kv, group_size=q["group_size"], bits=q["bits"])
                    out[f"{base}.kv_b_proj.weight"] = w
                    out[f"{base}.kv_b_proj.scales"] = scales
                    out[f"{base}.kv_b_proj.biases"] = biases
                else:
                    out[f"{base}.kv_b_proj.weight"] = kv
                out[f"{base}.rotary_emb.inv_freq"] = mx.zeros((4,))
            if q is not None:
                # Quantized experts stay stacked (sanitize stacks only
                # per-expert weights it finds).
                weights = {}
        if model_type == "glm4_moe":
            # The multi-token-prediction layer a GLM-4.5 checkpoint keeps
            # after its last decoder layer, which glm4_moe's sanitize drops
            # (its own weights and per-expert ones alike): random tensors.
            n = config["num_hidden_layers"]
            out[f"model.layers.{n}.eh_proj.weight"] = mx.ones((4, 8))
            out[f"model.layers.{n}.mlp.experts.0.up_proj.weight"] = mx.ones((4, 8))
            out[f"model.layers.{n}.self_attn.q_proj.weight"] = mx.ones((4, 8))
        for k, v in weights.items():
            if ".mlp.switch_mlp." not in k:
                continue
            if not k.endswith(".weight") or f"{k[:-len('weight')]}scales" in weights:
                raise SystemExit(f"{k}: only unquantized experts have a per-expert HF layout")
            base, leaf = k.split(".mlp.switch_mlp.")
            del out[k]
            for e in range(v.shape[0]):
                out[f"{base}.mlp.experts.{e}.{leaf}"] = v[e]
    elif model_type in ("qwen3_5", "qwen3_5_moe"):
        # Qwen3.5's Hugging Face original: `model.language_model.*` and a
        # top-level lm_head, the conv1d weights as [C, 1, K], the input /
        # post-attention / final / q / k norms stored as offsets around 0
        # (mlx-lm adds 1 back), plus an MTP head and a vision tensor that
        # sanitize drops.
        out = {}
        norms = (".input_layernorm.weight", ".post_attention_layernorm.weight",
                 "model.norm.weight", ".q_norm.weight", ".k_norm.weight")
        fused = {}
        for k, v in weights.items():
            if model_type == "qwen3_5_moe" and ".mlp.switch_mlp." in k:
                # qwen3_5_moe's HF experts: gate and up fused along -2.
                if f"{k[:-len('weight')]}scales" in weights:
                    raise SystemExit(f"{k}: only unquantized experts have the fused HF layout")
                base, leaf = k[len("language_model.model."):].split(".mlp.switch_mlp.")
                if leaf == "down_proj.weight":
                    out[f"model.language_model.{base}.mlp.experts.down_proj"] = v
                else:
                    fused.setdefault(base, {})[leaf] = v
                continue
            if k.startswith("language_model.model."):
                name = "model.language_model." + k[len("language_model.model."):]
            elif k == "language_model.lm_head.weight":
                name = "lm_head.weight"
            else:
                raise SystemExit(f"{k}: not in the qwen3_5 mlx layout")
            if "conv1d.weight" in k:
                v = mx.moveaxis(v, 2, 1)
            elif k.endswith(norms) and v.ndim == 1:
                v = v - 1.0
            out[name] = v
        for base, parts in fused.items():
            out[f"model.language_model.{base}.mlp.experts.gate_up_proj"] = mx.concatenate(
                [parts["gate_proj.weight"], parts["up_proj.weight"]], axis=-2)
        out["mtp.fc.weight"] = mx.zeros((2, 2))
        out["model.visual.patch_embed.proj.weight"] = mx.zeros((2, 2))
    elif model_type == "qwen3_next":
        # Qwen3-Next's Hugging Face original: per-expert weights (which are
        # what make its sanitize act at all), the conv1d weights as [C, 1, K],
        # the input / post-attention / final / q / k norms stored as offsets
        # around 0, and an MTP head that sanitize drops.
        out = {}
        norms = (".input_layernorm.weight", ".post_attention_layernorm.weight",
                 "model.norm.weight", ".q_norm.weight", ".k_norm.weight")
        for k, v in weights.items():
            if ".mlp.switch_mlp." in k:
                if f"{k[:-len('weight')]}scales" in weights:
                    raise SystemExit(f"{k}: only unquantized experts have a per-expert HF layout")
                base, leaf = k.split(".mlp.switch_mlp.")
                for e in range(v.shape[0]):
                    out[f"{base}.mlp.experts.{e}.{leaf}"] = v[e]
                continue
            if "conv1d.weight" in k:
                v = mx.moveaxis(v, 2, 1)
            elif k.endswith(norms) and v.ndim == 1:
                v = v - 1.0
            out[k] = v
        out["mtp.fc.weight"] = mx.zeros((2, 2))
    elif model_type == "minicpm":
        # MiniCPM's HF checkpoints tie the head to the embedding and store no
        # lm_head; only a head equal to the embedding can be dropped.
        head, embed = out.get("lm_head.weight"), out["model.embed_tokens.weight"]
        if head is None or head.shape != embed.shape or not mx.array_equal(head, embed).item():
            raise SystemExit("minicpm: lm_head.weight is absent or differs from "
                             "model.embed_tokens.weight; only an equal head can be dropped")
        del out["lm_head.weight"]
    else:
        raise SystemExit(f"family-hf-layout: no HF layout for model_type {model_type!r}")
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    mx.save_safetensors(str(dst / "model.safetensors"), out)


def batch(model_dir: Path, out: Path, ids: list[list[int]]) -> None:
    model = load(model_dir)
    # The model's make_cache where it has one, else a KVCache per layer
    # (deepseek_v3 has none).
    cache = make_prompt_cache(model)
    logits = model(mx.array(ids, dtype=mx.int32), cache=cache)
    mx.eval(logits)
    mx.save_safetensors(str(out), {"logits": logits})


def main() -> None:
    compat.apply()
    if sys.argv[1] == "hf-layout":
        hf_layout(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "family-hf-layout":
        family_hf_layout(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "batch":
        batch(Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]}")


if __name__ == "__main__":
    main()
