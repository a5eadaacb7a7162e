"""Renders chat templates with transformers, the reference archgen's chat
templates must match byte for byte.

usage: chat_template_oracle.py CASES.json

CASES.json is a list of {"dir": tokenizer directory, "messages": [...],
"add_generation_prompt": bool, "kwargs": {...}}. Prints a JSON list with, for
each case, {"text": rendered} or {"error": message} (a template that raises).
Each directory is loaded once with AutoTokenizer, as a user would load it.
"""

import json
import os
import sys

# transformers warns on import that PyTorch is absent; templates need no torch.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers import AutoTokenizer  # noqa: E402


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    tokenizers = {}
    out = []
    for case in cases:
        path = case["dir"]
        if path not in tokenizers:
            tokenizers[path] = AutoTokenizer.from_pretrained(path, local_files_only=True)
        tok = tokenizers[path]
        try:
            text = tok.apply_chat_template(
                case["messages"],
                tokenize=False,
                add_generation_prompt=case["add_generation_prompt"],
                **case.get("kwargs", {}),
            )
            out.append({"text": text})
        except Exception as e:  # the template's raise_exception
            out.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
