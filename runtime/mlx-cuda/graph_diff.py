"""Compare two MLX graphs written by `export_to_dot` (the workers' `dot` command:
runtime/bench/src/worker.rs and tests/python/bench_mlx_lm.py).

    python graph_diff.py A.dot B.dot [--show N]

What a DOT file from MLX 0.32 holds: one rectangle per primitive node (its
label is the primitive's name, e.g. "Matmul", "GatherQMM", "Transpose"; no
parameters; its id is the primitive's address, shared by the nodes that
replay one compiled function), one ellipse per array (a letter name, no shape or dtype), the
edges array -> node in the node's input order and node -> array in output
order; arrays with no primitive (weights, the cache's evaluated buffers,
the prompt ids, scalar constants) are `rank=source`. Array and node names
are per-process, so the two files cannot be compared by name.

How they are made comparable:
  * every source array is the same leaf `src` (weights, cache buffers, ids
    and constants are not told apart: the DOT has no shapes to tell them by);
  * every node gets a structural hash: its op name and the hashes of its
    inputs in input order, except for commutative element-wise ops (Add,
    Multiply, Maximum, Minimum, Equal, NotEqual, LogicalAnd, LogicalOr) whose
    input hashes are sorted (a*b vs b*a is harmless); an output array's hash
    is its node's hash and its output index;
  * the canonical listing is the nodes ordered by a depth-first walk from the
    graph's outputs, inputs in (canonical) order, each line
    `op <- (input op, ...)`.

What is printed:
  1. the per-op count table of both graphs (and the difference), and the
     neighbourhoods (a node's op with its inputs' ops, `--depth` levels up)
     whose counts differ: unlike the frontier, these still show a later
     difference after an earlier one changed every hash downstream;
  2. the divergence frontier: nodes of A whose hash has no node in B although
     every input of theirs does (the first places where A's graph stops being
     B's), and the same from B's side, grouped by `op <- (input ops)` with a
     count and the position in the canonical listing of the first one, plus
     the chain of ops that consumes it (so one can tell which layer/block it
     is in). Identical graphs print "no structural difference".

What it cannot see: shapes, dtypes, strides and primitive parameters
(transpose axes, a quantized matmul's flags, `sorted_indices`), and on a
CPU-only libmlx the `mx.fast` ops (rms_norm, rope, scaled_dot_product_attention,
layer_norm) are recorded as their fallback decomposition, so a fast op on one
side and the same decomposition written out by hand on the other look the same
here although on the GPU one is a kernel and the other a chain of ops.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import re
import sys
from pathlib import Path

COMMUTATIVE = {"Add", "Multiply", "Maximum", "Minimum", "Equal", "NotEqual",
               "LogicalAnd", "LogicalOr"}

NODE = re.compile(r'^\{ (\S+) \[label ="([^"]*)", shape=rectangle\]; \}$')
SOURCE = re.compile(r'^\{ rank=source; "([^"]+)"; \}$')
ARRAY = re.compile(r'^\{ (?:rank=sink; )?"([^"]+)"; \}$')
EDGE = re.compile(r'^("?)([^" ]+)\1 -> ("?)([^" ]+)\3$')


class Graph:
    def __init__(self, path: Path):
        self.path = path
        self.op: dict[str, str] = {}              # node id -> op name
        self.inputs: dict[str, list[str]] = {}    # node id -> input arrays
        self.outputs: dict[str, list[str]] = {}   # node id -> output arrays
        self.producer: dict[str, tuple[str, int]] = {}  # array -> (node, index)
        self.sources: set[str] = set()
        self.consumers: dict[str, list[str]] = collections.defaultdict(list)
        arrays: set[str] = set()
        current: dict[str, str] = {}  # DOT node id -> the node its edges belong to
        text = path.read_text()
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if line in ("digraph {", "}", ""):
                continue
            if m := NODE.match(line):
                # The DOT id is the primitive's address, which several nodes
                # share when they replay one compiled tape (mx.compile): each
                # label line is a node of its own, and the edges right after
                # it are its edges.
                current[m[1]] = node = f"{m[1]}#{lineno}"
                self.op[node] = m[2]
                self.inputs[node] = []
                self.outputs[node] = []
            elif m := SOURCE.match(line):
                self.sources.add(m[1])
                arrays.add(m[1])
            elif m := ARRAY.match(line):
                arrays.add(m[1])
            elif m := EDGE.match(line):
                a, b = m[2], m[4]
                a_is_array, b_is_array = m[1] == '"', m[3] == '"'
                a, b = (a if a_is_array else current.get(a, a),
                        b if b_is_array else current.get(b, b))
                if a_is_array and b in self.op:
                    self.inputs[b].append(a)
                    self.consumers[a].append(b)
                elif a in self.op and b_is_array:
                    self.producer[b] = (a, len(self.outputs[a]))
                    self.outputs[a].append(b)
                else:
                    sys.exit(f"{path}:{lineno}: edge '{line}' is neither array -> node "
                             f"nor node -> array")
            else:
                sys.exit(f"{path}:{lineno}: unexpected line '{line}' (not MLX export_to_dot)")
        for a in arrays:
            if a not in self.sources and a not in self.producer:
                sys.exit(f"{path}: array {a} has no producer and is not a source")
        # Graph outputs: arrays no node consumes.
        self.sinks = sorted(a for a in arrays if a not in self.consumers)
        self._hash: dict[str, str] = {}
        self._hash_all()
        self._order()

    def array_hash(self, a: str) -> str:
        if a in self.sources:
            return "src"
        node, index = self.producer[a]
        return f"{self.node_hash(node)}.{index}"

    def node_hash(self, node: str) -> str:
        return self._hash[node]

    def _postorder(self, roots: list[str], inputs_of) -> list[str]:
        """Iterative depth-first post-order over producers (graphs are
        thousands of nodes deep); each node is expanded once."""
        order: list[str] = []
        state: dict[str, int] = {}  # 1 = expanded, 2 = emitted
        for root in roots:
            if root in state:
                continue
            stack = [(root, iter(inputs_of(root)))]
            state[root] = 1
            while stack:
                n, it = stack[-1]
                for a in it:
                    if a in self.sources:
                        continue
                    p = self.producer[a][0]
                    if p not in state:
                        state[p] = 1
                        stack.append((p, iter(inputs_of(p))))
                        break
                else:
                    stack.pop()
                    state[n] = 2
                    order.append(n)
        return order

    def _hash_all(self) -> None:
        for n in self._postorder(sorted(self.op), lambda n: self.inputs[n]):
            ins = [self.array_hash(a) for a in self.inputs[n]]
            if self.op[n] in COMMUTATIVE:
                ins.sort()
            digest = hashlib.sha1((self.op[n] + "(" + ",".join(ins) + ")").encode())
            self._hash[n] = digest.hexdigest()[:16]

    def canonical_inputs(self, node: str) -> list[str]:
        ins = list(self.inputs[node])
        if self.op[node] in COMMUTATIVE:
            ins.sort(key=self.array_hash)
        return ins

    def _order(self) -> None:
        """Canonical topological order: depth-first from the sinks (sorted by
        hash), inputs in canonical order."""
        roots = sorted({self.producer[s][0] for s in self.sinks if s in self.producer},
                       key=self.node_hash)
        self.order = self._postorder(roots, self.canonical_inputs)
        self.position = {n: i for i, n in enumerate(self.order)}

    def describe(self, node: str) -> str:
        ins = []
        for a in self.canonical_inputs(node):
            ins.append("src" if a in self.sources else self.op[self.producer[a][0]])
        return f"{self.op[node]} <- ({', '.join(ins)})"

    def consumer_chain(self, node: str, length: int = 6) -> str:
        chain, n = [], node
        for _ in range(length):
            users = [u for a in self.outputs[n] for u in self.consumers.get(a, [])]
            if not users:
                break
            n = min(users, key=lambda u: self.position[u])
            chain.append(self.op[n])
        return " -> ".join(chain) if chain else "(graph output)"

    def local(self, node: str, depth: int) -> str:
        """The node's op and, `depth` levels up, its inputs' (canonical order)."""
        if depth == 0:
            return self.op[node]
        ins = ["src" if a in self.sources else self.local(self.producer[a][0], depth - 1)
               for a in self.canonical_inputs(node)]
        if self.op[node] in COMMUTATIVE:
            ins.sort()
        return f"{self.op[node]}({', '.join(ins)})"

    def locals(self, depth: int) -> collections.Counter:
        return collections.Counter(self.local(n, depth) for n in self.op)

    def counts(self) -> collections.Counter:
        return collections.Counter(self.op.values())


def frontier(a: Graph, b: Graph) -> list[str]:
    """Nodes of `a` with no structurally equal node in `b` whose inputs all
    have one (or are sources): where `a` first departs from `b`."""
    b_hashes = {b.node_hash(n) for n in b.op}
    out = []
    for n in a.order:
        if a.node_hash(n) in b_hashes:
            continue
        if all(x in a.sources or a.node_hash(a.producer[x][0]) in b_hashes
               for x in a.inputs[n]):
            out.append(n)
    return out


def report(a: Graph, b: Graph, show: int, local_depth: int) -> int:
    ca, cb = a.counts(), b.counts()
    print(f"A = {a.path}: {sum(ca.values())} nodes, {len(a.sources)} source arrays")
    print(f"B = {b.path}: {sum(cb.values())} nodes, {len(b.sources)} source arrays")
    print(f"\n{'op':<28}{'A':>8}{'B':>8}{'A-B':>8}")
    for op in sorted(set(ca) | set(cb)):
        d = ca[op] - cb[op]
        print(f"{op:<28}{ca[op]:>8}{cb[op]:>8}{d:>+8}" + ("   <-" if d else ""))
    # Local shapes of the graph, robust to an earlier divergence upstream:
    # each node with its inputs and their inputs, counted on both sides.
    la, lb = a.locals(local_depth), b.locals(local_depth)
    extra = [(k, la[k] - lb[k]) for k in sorted(set(la) | set(lb)) if la[k] != lb[k]]
    if extra:
        print(f"\nnode neighbourhoods (op with {local_depth} levels of inputs) whose counts differ:")
        for k, d in sorted(extra, key=lambda kd: (-abs(kd[1]), kd[0]))[: 3 * show]:
            print(f"  {d:>+5}  {k}")
        if len(extra) > 3 * show:
            print(f"  ... {len(extra) - 3 * show} more")
    fa, fb = frontier(a, b), frontier(b, a)
    if not fa and not fb and ca == cb:
        print("\nno structural difference (same ops, same operand order modulo "
              "commutative element-wise ops)")
        return 0
    for name, g, nodes in (("A", a, fa), ("B", b, fb)):
        print(f"\nonly in {name} (divergence frontier, {len(nodes)} nodes):")
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for n in nodes:
            groups[g.describe(n)].append(n)
        for i, (desc, ns) in enumerate(sorted(groups.items(),
                                              key=lambda kv: g.position[kv[1][0]])):
            if i == show:
                print(f"  ... {len(groups) - show} more groups")
                break
            first = ns[0]
            print(f"  {len(ns):>4} x {desc}   first at #{g.position[first]}"
                  f"/{len(g.order)}, used by {g.consumer_chain(first)}")
    return 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--show", type=int, default=12, help="frontier groups to print per side")
    p.add_argument("--depth", type=int, default=2,
                   help="levels of inputs in the neighbourhood counts (default 2)")
    args = p.parse_args()
    sys.exit(report(Graph(args.a), Graph(args.b), args.show, args.depth))


if __name__ == "__main__":
    main()
