"""Gives a tiny checkpoint directory what a chat needs: a byte-level BPE
tokenizer.json trained here on a few sentences (its vocabulary fits the
model's vocab_size), a tokenizer_config.json with a chat template, and a
generation_config.json naming the end-of-turn token as EOS.

usage: make_chat_tokenizer.py MODEL_DIR TEMPLATE.jinja [ADDED.json]

ADDED.json, when given, is a list of strings that become added (non-special)
tokens, each one id, after a BPE trained that many ids smaller: a checkpoint
whose weights write those pieces (make_tool_call_model.py) needs them atomic.

Prints {"vocab_size": N, "eos": [ids], "added": [ids]} as JSON.
"""

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello there! How are you today? I am fine, thank you.",
    "You are a helpful assistant. Answer the question in one sentence.",
    "Tell me a joke about a cat, a dog and a fox.",
    "What is two plus two? Two plus two is four.",
    "system user assistant model reply message chat server token",
] * 4
# Enough distinct words that training fills the whole vocabulary (so every id
# the model can sample decodes to text).
WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu red orange yellow green blue "
    "indigo violet black white silver golden purple mountain river ocean forest desert island valley "
    "winter spring summer autumn morning evening night sunrise sunset thunder lightning rainbow"
).split()
CORPUS += [" ".join(WORDS[(i * 7 + k * 13) % len(WORDS)] for k in range(6)) for i in range(400)]


def main() -> None:
    model_dir = Path(sys.argv[1])
    template = Path(sys.argv[2]).read_text(encoding="utf-8")
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    vocab_size = config["vocab_size"]
    added = json.loads(Path(sys.argv[3]).read_text(encoding="utf-8")) if len(sys.argv) > 3 else []

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(added),
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    if added:
        tok.add_tokens([AddedToken(a, normalized=False) for a in added])
    assert tok.get_vocab_size() <= vocab_size, (tok.get_vocab_size(), vocab_size)
    tok.save(str(model_dir / "tokenizer.json"))

    tokenizer_config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": template,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}), encoding="utf-8")
    ids = [tok.token_to_id(a) for a in added]
    print(json.dumps({"vocab_size": tok.get_vocab_size(), "eos": eos, "added": ids}))


if __name__ == "__main__":
    main()
