"""mlx-lm 0.32.2's single-sequence generation (`mlx_lm.generate.generate_step`)
of one prompt: the reference a batch of ONE row with no padding is compared
with, byte for byte, where mlx-lm has no batch to compare with (a quantized
KV cache: `QuantizedKVCache` has no merge(), `BatchGenerator` no kv_bits; see
docs/parity.md, "Batches").

Usage: single_seq_oracle.py MODEL_DIR JOB.json OUT.safetensors

JOB.json:
    {"prompt": [ids...], "decode": N, "prefill_step_size": 4,
     "kv_config": "quantized"|"optiq"|"ignored",
     "kv_bits": null|B, "kv_group_size": 64, "quantized_kv_start": 0}

The prompt cache is `make_prompt_cache(model)`. MODEL_DIR's kv_config.json
([{"layer_idx": i, "bits": b, "group_size": g}]), when there is one, applies as
"kv_config" says:
  quantized  each listed layer's KVCache becomes QuantizedKVCache(group_size=g,
             bits=b) before the prompt (archgen's kv_quantization; what
             oracle_logits.py does for the logits protocol). The default.
  optiq      mlx-optiq's install_mixed_kv with quantized_kv_start from
             kv_scheme.json (archgen's mixed_kv, tier L2; optiq_oracle.py):
             its hook replaces mlx-lm's maybe_quantize_kv_cache, which
             generate_step calls after every forward.
  ignored    the file is not read: kv_bits, kv_group_size and
             quantized_kv_start alone decide (mlx-lm's own conversion of every
             KVCache, `to_quantized` of its whole buffers, after a forward).
kv_bits, kv_group_size and quantized_kv_start go to generate_step as they are.
Greedy sampling (argmax of the logprobs); N tokens, no stop tokens.

Writes:
    logprobs  [N, vocab]  the logprobs rows generate_step yielded, in the
                          compute dtype (logits - logsumexp(logits))
    tokens    [N] int32   the greedy tokens yielded with them
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_logits import load, read_kv_config  # noqa: E402  (compat.apply() inside)
import optiq_oracle  # noqa: E402

from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.cache import KVCache, make_prompt_cache  # noqa: E402


def run(model_dir: Path, job: dict) -> dict[str, mx.array]:
    model = load(model_dir)
    cache = make_prompt_cache(model)
    kv_config = read_kv_config(model_dir) or {}
    mode = job.get("kv_config", "quantized")
    if mode == "quantized":
        for i, (bits, group_size) in sorted(kv_config.items()):
            if i >= len(cache) or type(cache[i]) is not KVCache:
                raise SystemExit(f"kv_config: layer {i} has no KVCache (sliding or KV-shared)")
            cache[i] = cache[i].to_quantized(group_size=group_size, bits=bits)
    elif mode == "optiq":
        if not kv_config:
            raise SystemExit("kv_config optiq: the model directory has no kv_config.json")
        optiq_oracle.install(kv_config, optiq_oracle.read_kv_scheme(model_dir))
    elif mode != "ignored":
        raise SystemExit(f"kv_config: {mode!r} is not quantized, optiq or ignored")
    decode = int(job["decode"])
    rows, tokens = [], []
    # generate_step reads its module's maybe_quantize_kv_cache when called,
    # so optiq's install (which replaces it) applies.
    steps = generate_step(
        mx.array(job["prompt"], dtype=mx.int32),
        model,
        max_tokens=decode,
        sampler=lambda logprobs: mx.argmax(logprobs, axis=-1),
        prompt_cache=cache,
        prefill_step_size=int(job.get("prefill_step_size", 2048)),
        kv_bits=job.get("kv_bits"),
        kv_group_size=int(job.get("kv_group_size", 64)),
        quantized_kv_start=int(job.get("quantized_kv_start", 0)),
    )
    for token, logprobs in steps:
        rows.append(logprobs)
        tokens.append(int(token))
    if len(tokens) != decode:
        raise SystemExit(f"single_seq_oracle.py: {len(tokens)} tokens, asked for {decode}")
    out = {"logprobs": mx.stack(rows), "tokens": mx.array(tokens, dtype=mx.int32)}
    mx.eval(out)
    return out


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    model_dir, job_path, out_path = map(Path, sys.argv[1:])
    job = json.loads(job_path.read_text())
    tensors = run(model_dir, job)
    mx.save_safetensors(str(out_path), tensors,
                        metadata={"job": json.dumps(job), "mlx": mx.__version__})


if __name__ == "__main__":
    main()
