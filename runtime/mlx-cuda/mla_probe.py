"""Which form of DeepSeek-V3's latent attention moves mlx-lm's bytes on CUDA.

On the CPU archgen's latent attention and mlx-lm's `DeepseekV3Attention`
give the same bytes; on the H200 they differ from the third prompt row on,
while both launch the same kernels (parity.md, the GPU parity table). This
probe runs mlx-lm's one-sequence prefill on the GPU with its attention
rewritten in each of the forms archgen's graph takes where it differs from
mlx-lm's in form, one at a time and all together, and compares every
variant's prefill logits with mlx-lm's own and with archgen's
(`archgen logits`, both paths, same ids):

  slice         q and the latent cut with slices, not `mx.split`
  array_offset  RoPE's offset an int32 array, not a Python int
  eager_freqs   the YaRN frequencies evaluated before the forward
  mask_cast     the mask's fill value made in float32 and cast
  scale_cast    the query's weak scale made in float32 and cast
  layer_mask    the causal mask made in every layer

A variant that lands on archgen's bytes names the form that moves them.
With --repeat N it runs mlx-lm's own module N times in the one process
instead and says which runs give the same bytes, and which of them archgen's
equal (run it again with MLX_CUDA_USE_CUDNN_SDPA=0, for both sides, to see
whether cuDNN's attention is what varies).

  mla_probe.py --model DIR --archgen BIN [--prompt-len 24] [--repeat N] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models import deepseek_v3
from mlx_lm.models.base import create_causal_mask, scaled_dot_product_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
import oracle_logits  # noqa: E402

FORMS = ("slice", "array_offset", "eager_freqs", "mask_cast", "scale_cast", "layer_mask")
ON: set[str] = set()
ORIGINAL = deepseek_v3.DeepseekV3Attention.__call__


def attention(self, x, mask=None, cache=None):
    """mlx-lm 0.32.2's `DeepseekV3Attention.__call__`, with the forms in ON."""
    B, L, _ = x.shape
    if self.q_lora_rank is None:
        q = self.q_proj(x)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
    q = q.reshape(B, L, self.num_heads, self.q_head_dim).transpose(0, 2, 1, 3)
    compressed_kv = self.kv_a_proj_with_mqa(x)
    if "slice" in ON:
        q_nope, q_pe = q[..., : self.qk_nope_head_dim], q[..., self.qk_nope_head_dim:]
        compressed_kv, k_pe = (compressed_kv[..., : self.kv_lora_rank],
                               compressed_kv[..., self.kv_lora_rank:])
    else:
        q_nope, q_pe = mx.split(q, [self.qk_nope_head_dim], axis=-1)
        compressed_kv, k_pe = mx.split(compressed_kv, [self.kv_lora_rank], axis=-1)
    k_pe = k_pe.reshape(B, L, 1, self.qk_rope_head_dim).transpose(0, 2, 1, 3)
    kv_latent = self.kv_a_layernorm(compressed_kv)
    offset = cache.offset if cache is not None else 0
    if "array_offset" in ON:
        offset = mx.array(offset, dtype=mx.int32)
    q_pe = self.rope(q_pe, offset)
    k_pe = self.rope(k_pe, offset)
    kv_latent = mx.expand_dims(kv_latent, axis=1)
    if "layer_mask" in ON and L > 1:
        mask = create_causal_mask(L, cache.offset if cache is not None else 0)
    if cache is not None:
        kv_latent, k_pe = cache.update_and_fetch(kv_latent, k_pe)
    if "scale_cast" in ON:
        scale = mx.array(self.scale, dtype=mx.float32).astype(q_pe.dtype)
        pe_scores = (q_pe * scale) @ k_pe.swapaxes(-1, -2)
    else:
        pe_scores = (q_pe * self.scale) @ k_pe.swapaxes(-1, -2)
    if mask is not None:
        dtype = pe_scores.dtype
        if "mask_cast" in ON:
            fill = mx.array(float(mx.finfo(dtype).min), dtype=mx.float32).astype(dtype)
        else:
            fill = mx.array(mx.finfo(dtype).min, dtype)
        pe_scores = mx.where(mask, pe_scores, fill)
    if L == 1:
        q_nope = self.embed_q(q_nope)
        k = v = kv_latent
    else:
        k = self.embed_q(kv_latent, transpose=False)
        v = self.unembed_out(kv_latent)
    output = scaled_dot_product_attention(q_nope, k, v, cache=cache, scale=self.scale, mask=pe_scores)
    if L == 1:
        output = self.unembed_out(output)
    output = output.transpose(0, 2, 1, 3).reshape(B, L, -1)
    return self.o_proj(output)


def prefill(model, ids: list[int]) -> np.ndarray:
    if "eager_freqs" in ON:
        mx.eval([layer.self_attn.rope._freqs for layer in model.model.layers])
    tensors, _ = oracle_logits.run_protocol(model, ids, 0)
    return np.array(tensors["prefill_logits"].astype(mx.float32))


def rows_differing(a: np.ndarray, b: np.ndarray) -> list[int]:
    return [i for i in range(a.shape[0]) if not np.array_equal(a[i], b[i])]


def repeat(model, ids: list[int], n: int, theirs: dict, out: Path | None) -> None:
    """mlx-lm's module n times in one process: each run's outcome (runs with
    the same bytes share one), and the outcome archgen's paths equal."""
    outcomes: list[np.ndarray] = []
    runs = []
    for _ in range(n):
        got = prefill(model, ids)
        same = [k for k, o in enumerate(outcomes) if np.array_equal(o, got)]
        if not same:
            outcomes.append(got)
            same = [len(outcomes) - 1]
        runs.append(same[0])
    report = {"runs' outcomes": runs}
    for impl, logits in theirs.items():
        report[f"archgen {impl} equals outcome"] = [
            k for k, o in enumerate(outcomes) if np.array_equal(o, logits)]
    for k, o in enumerate(outcomes[1:], 1):
        report[f"outcome {k} vs outcome 0: rows"] = rows_differing(o, outcomes[0])
    for k, v in report.items():
        print(f"mla-probe {k}: {v}")
    if out:
        out.write_text(json.dumps(report, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--archgen", required=True)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    vocab = json.loads((a.model / "config.json").read_text())["vocab_size"]
    ids = [(i * 37 + 11) % vocab for i in range(a.prompt_len)]
    theirs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for impl in ("monolith", "generated"):
            out = Path(tmp) / f"{impl}.safetensors"
            ran = subprocess.run([a.archgen, "logits", "--model", str(a.model), "--prompt-ids",
                                  ",".join(map(str, ids)), "--decode-steps", "0", "--impl", impl,
                                  "--out", str(out)], capture_output=True, text=True)
            if ran.returncode != 0:
                # A probe checkpoint has no generated model: the monolith alone.
                print(f"mla-probe archgen {impl}: {ran.stderr.strip().splitlines()[-1]}")
                continue
            theirs[impl] = np.array(mx.load(str(out))["prefill_logits"].astype(mx.float32))
    model = oracle_logits.load(a.model)
    if a.repeat:
        repeat(model, ids, a.repeat, theirs, a.out)
        return
    deepseek_v3.DeepseekV3Attention.__call__ = attention
    report = {}
    if "generated" in theirs:
        report["archgen monolith vs generated"] = rows_differing(theirs["monolith"], theirs["generated"])
    stock = prefill(model, ids)
    ON.clear()
    again = prefill(model, ids)
    report["stock vs stock again"] = rows_differing(stock, again)
    report["stock vs archgen"] = rows_differing(stock, theirs["monolith"])
    for variant in [(f,) for f in FORMS] + [FORMS]:
        ON.clear()
        ON.update(variant)
        got = prefill(model, ids)
        name = "+".join(variant)
        report[f"{name} vs stock"] = rows_differing(got, stock)
        report[f"{name} vs archgen"] = rows_differing(got, theirs["monolith"])
    ON.clear()
    deepseek_v3.DeepseekV3Attention.__call__ = ORIGINAL
    report["original module vs stock"] = rows_differing(prefill(model, ids), stock)
    for k, v in report.items():
        print(f"mla-probe {k}: {len(v)} rows differ {v[:8]}")
    if a.out:
        a.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
