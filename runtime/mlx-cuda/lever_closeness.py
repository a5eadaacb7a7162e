"""How close an L3 lever's run stays to the L1 run: two `archgen logits`
outputs of the same checkpoint and prompt (torch on the GPU machine).
Prints, per tensor, the values that differ and the largest absolute
difference, and for the greedy tokens how many agree and the first step
where they part.
Usage: lever_closeness.py L1.safetensors LEVER.safetensors NAME"""
import sys

import torch
from safetensors.torch import load_file

a, b, name = load_file(sys.argv[1]), load_file(sys.argv[2]), sys.argv[3]
parts = []
for k in ("prefill_logits", "decode_logits"):
    x, y = a[k].float(), b[k].float()
    n = int((x != y).sum())
    parts.append(f"{k}: {n} of {x.numel()} differ, max |diff| {float((x - y).abs().max()):.4g}")
t, u = a["tokens"].tolist(), b["tokens"].tolist()
same = sum(p == q for p, q in zip(t, u))
first = next((i for i, (p, q) in enumerate(zip(t, u)) if p != q), None)
parts.append(f"greedy tokens: {same} of {len(t)} agree"
             + ("" if first is None else f", first parting at step {first}"))
print(f"closeness {name}: " + "; ".join(parts))
