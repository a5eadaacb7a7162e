"""Byte comparison of two `archgen logits` outputs (safetensors), for the GPU
machine, which has torch and safetensors but no mlx Python package.
Usage: compare.py A.safetensors B.safetensors  -> prints IDENTICAL or DIFF ..."""
import sys

from safetensors.torch import load_file

a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
diffs = []
for k in sorted(a):
    x, y = a[k], b[k]
    if x.dtype != y.dtype or x.shape != y.shape:
        diffs.append(f"{k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
    elif x.contiguous().view(-1).view(dtype=__import__("torch").uint8).tolist() != \
            y.contiguous().view(-1).view(dtype=__import__("torch").uint8).tolist():
        diffs.append(f"{k}: bytes differ")
print("IDENTICAL" if not diffs else "DIFF " + "; ".join(diffs), f"({', '.join(f'{k}{tuple(a[k].shape)}' for k in sorted(a))})")
