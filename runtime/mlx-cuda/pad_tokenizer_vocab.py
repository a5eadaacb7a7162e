"""Pads a checkpoint's byte-level BPE tokenizer.json (as
tests/python/make_chat_tokenizer.py writes it) to the model's whole
vocab_size, so that every id a random-weight model can sample decodes to
text.

Why: make_chat_tokenizer.py trains its BPE on a few sentences, which fills a
tiny spec's vocabulary (512 ids) but not a real one (gemma4-12b: 262,144).
A random-weight gemma4-12b samples ids all over its vocabulary, and the two
servers treat ids past the tokenizer differently: mlx-lm's
BPEStreamingDetokenizer prints "!" for each, archgen's detokenizer (the HF
tokenizers library) prints nothing, so one server would stream a chunk per
token and the other none, and time to first token and inter-token latency
would not compare. Padded, both stream one word per token.

Each added id N gets the vocabulary entry "Ġ" + N in base 26 (letters
a-z), which decodes to a space and a short lowercase word; entries already
in the vocabulary are skipped. No merges are added: the padding is for
decoding; encoding a prompt still goes through the trained merges.

usage: pad_tokenizer_vocab.py MODEL_DIR
Prints {"trained": N, "padded_to": vocab_size} as JSON.
"""

import json
import string
import sys
from pathlib import Path


def word(n: int) -> str:
    letters = string.ascii_lowercase
    out = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        out = letters[r] + out
    return out


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    model_dir = Path(sys.argv[1])
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    vocab_size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    path = model_dir / "tokenizer.json"
    tok = json.loads(path.read_text(encoding="utf-8"))
    model = tok["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"{path}: model.type is {model.get('type')!r}, expected 'BPE'")
    vocab: dict[str, int] = model["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in tok.get("added_tokens", [])}
    trained = len(taken)
    if max(taken) >= vocab_size:
        raise SystemExit(f"{path}: ids up to {max(taken)}, past the model's vocab_size {vocab_size}")
    n = 0
    for token_id in range(vocab_size):
        if token_id in taken:
            continue
        while "Ġ" + word(n) in vocab:
            n += 1
        vocab["Ġ" + word(n)] = token_id
        n += 1
    path.write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    print(json.dumps({"trained": trained, "padded_to": vocab_size}))


if __name__ == "__main__":
    main()
