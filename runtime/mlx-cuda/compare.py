"""Byte comparison of two `archgen logits` outputs (safetensors), for the GPU
machine, which has torch and safetensors but no mlx Python package.
Usage: compare.py A.safetensors B.safetensors  -> prints IDENTICAL or DIFF (values that differ per tensor)"""
import sys

import torch

from safetensors.torch import load_file

a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
diffs = []
for k in sorted(a):
    x, y = a[k], b[k]
    if x.dtype != y.dtype or x.shape != y.shape:
        diffs.append(f"{k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
    else:
        # Compare as integers of the element's width, so the count is of values.
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
        n = int((x.contiguous().view(-1).view(bits) != y.contiguous().view(-1).view(bits)).sum())
        if n:
            diffs.append(f"{k}: {n} of {x.numel()} values differ")
print("IDENTICAL" if not diffs else "DIFF " + "; ".join(diffs), f"({', '.join(f'{k}{tuple(a[k].shape)}' for k in sorted(a))})")
