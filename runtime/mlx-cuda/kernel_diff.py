"""Which CUDA kernels two runs launched, compared in order.

MLX's CUDA backend writes every committed graph as PREFIX_<n>.dot when
MLX_SAVE_CUDA_GRAPHS_DOT_FILE=PREFIX is set (cudaGraphDebugDotPrint). Run the
same protocol twice (say mlx-lm and `archgen logits`), each with its own
PREFIX, then:

  kernel_diff.py DIR_A DIR_B

lists the kernels of each run in launch order (files by n, nodes by their
order in the file), and prints the first places where the two sequences
differ, with the demangled-enough names (template arguments kept). Same
sequence = same kernels and same variants: a byte difference then comes from
the data fed in, not from a different algorithm.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path


def kernels(d: Path) -> list[str]:
    files = sorted(d.glob("*.dot"), key=lambda p: int(re.findall(r"_(\d+)\.dot$", p.name)[0]))
    seq = []
    for f in files:
        for line in f.read_text(errors="replace").splitlines():
            # Kernel nodes carry the function name (mangled, `_Z...`).
            for m in re.findall(r"(_Z[0-9A-Za-z_]+)", line):
                seq.append(m)
                break
    return seq


def short(name: str) -> str:
    return name if len(name) < 160 else name[:157] + "..."


def main() -> None:
    a, b = Path(sys.argv[1]), Path(sys.argv[2])
    ka, kb = kernels(a), kernels(b)
    print(f"{a}: {len(ka)} kernel nodes in {len(list(a.glob('*.dot')))} graphs; "
          f"{b}: {len(kb)} kernel nodes in {len(list(b.glob('*.dot')))} graphs")
    sm = difflib.SequenceMatcher(a=ka, b=kb, autojunk=False)
    shown = 0
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        print(f"-- {tag} at A[{i1}:{i2}] B[{j1}:{j2}]")
        for k in ka[i1:min(i2, i1 + 4)]:
            print(f"   A {short(k)}")
        for k in kb[j1:min(j2, j1 + 4)]:
            print(f"   B {short(k)}")
        shown += 1
        if shown >= 12:
            print("   (more differences left out)")
            break
    if shown == 0:
        print("same kernel sequence")
    only_a = sorted(set(ka) - set(kb))
    only_b = sorted(set(kb) - set(ka))
    for k in only_a[:10]:
        print(f"only in A: {short(k)}")
    for k in only_b[:10]:
        print(f"only in B: {short(k)}")


if __name__ == "__main__":
    main()
