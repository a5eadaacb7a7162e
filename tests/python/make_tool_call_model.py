"""Rewrites a tiny tied-head dense checkpoint (qwen3-0.6b-tiny, from
`archgen init` plus make_chat_tokenizer.py with the pieces as added tokens)
so that greedy decoding after any chat prompt writes a fixed chain of
tokens: the pieces of a tool call, then the end-of-turn token. A random-weight
model writes no tool markup, so this is how a server test sees the model
side of a tool call end to end.

usage: make_tool_call_model.py MODEL_DIR PIECE_IDS

PIECE_IDS: comma-separated ids of the pieces in order (the added tokens).

How: every layer's output projections (o_proj, down_proj) are zero, so the
last hidden state is the current token's embedding; the final norm's weight
is one. Only the chain's tokens have embeddings: token i of the chain is
s_i * (v_i + v_{i+1}) / sqrt(2) for orthonormal v, with s tripling along the
chain. With the head tied to the embedding, token i's logits are
s_j * sqrt(hidden) * cos(j, i): s_i for itself, s_{i+1} / 2 for the next one,
s_{i-1} / 2 for the one before and 0 for every other token, so the next one
(3 s_i / 2) wins. The chain starts at the prompt's last token, which is the
same for every generation prompt of the template (its assistant header).
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
from transformers import AutoTokenizer


def main() -> None:
    model_dir = Path(sys.argv[1])
    pieces = [int(t) for t in sys.argv[2].split(",")]
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        for text in ("hi", "What is the weather in Paris?")
    ]
    last = {tok(p, add_special_tokens=False)["input_ids"][-1] for p in prompts}
    if len(last) != 1:
        raise SystemExit(f"the generation prompts end in different tokens {last}: no one chain start")
    start = last.pop()
    eos = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"][0]
    chain = [start, *pieces, eos]
    if len(set(chain)) != len(chain):
        raise SystemExit(f"the chain {chain} repeats a token: greedy decoding would loop")

    path = model_dir / "model.safetensors"
    weights = mx.load(str(path))
    embed_key = next(k for k in weights if k.endswith("embed_tokens.weight"))
    vocab, hidden = weights[embed_key].shape
    if len(chain) + 1 > hidden:
        raise SystemExit(f"a chain of {len(chain)} needs hidden > {len(chain)}, not {hidden}")
    dtype = weights[embed_key].dtype
    for key, w in weights.items():
        if key.endswith(("o_proj.weight", "down_proj.weight")):
            weights[key] = mx.zeros(w.shape, dtype=w.dtype)
        elif key.endswith("model.norm.weight"):
            weights[key] = mx.ones(w.shape, dtype=w.dtype)
    embed = [[0.0] * hidden for _ in range(vocab)]
    scale = 1.0
    for i, token in enumerate(chain):
        embed[token][i] = scale / 2**0.5
        embed[token][i + 1] = scale / 2**0.5
        scale *= 3.0
    weights[embed_key] = mx.array(embed, dtype=dtype)
    # mx.load reads lazily from the file: evaluate, write aside, then replace.
    mx.eval(list(weights.values()))
    tmp = path.with_suffix(".tmp.safetensors")
    mx.save_safetensors(str(tmp), weights, metadata={"format": "mlx"})
    tmp.replace(path)
    print(json.dumps({"chain": chain}))


if __name__ == "__main__":
    main()
