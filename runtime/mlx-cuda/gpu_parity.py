"""The GPU parity table (docs/parity.md, "On the GPU"): every case x
{generated, monolith} x {one sequence, a batch} against mlx-lm 0.32.2, all
on MLX's CUDA backend, byte for byte.

Runs on the GPU machine (runtime/mlx-cuda/parity.sh `table` sets it up).
Per case SPEC:L:N (SPEC@DTYPE:L:N: the checkpoint in DTYPE, init's --dtype):
  * `archgen init --spec SPEC --seed 1` makes the checkpoint;
  * one sequence: `archgen logits` over the prompt ids (i*37+11) % vocab,
    i < L, then N greedy steps (docs/parity.md §2), `--impl generated` (the
    default GPU decode path) and `--impl monolith`;
  * a batch: `archgen logits --batch` over each schedule of SCHEDULES (mlx-lm
    BatchGenerator's scheduling: staggered arrivals, a cancellation in
    prefill and one while generating, chunked prefill), both implementations;
  * mlx-lm: runtime/mlx-cuda/gpu_oracle.py in a fresh process (the same
    protocol and tests/python/batch_oracle.py). Where archgen differs from
    it, mlx-lm runs again in fresh processes (--oracle-runs in all; the
    one-sequence protocol runs twice in each process) until two of its
    outputs differ or archgen equals one of them: if two differ, the cell
    says "mlx-lm not reproducible" and what differed; and archgen runs that
    cell once more, in a fresh process, to say whether it reproduces itself.
Each cell: `identical`, `differs (n of m values: tensor, ...)`,
`mlx-lm not reproducible (...)`, `n/a (why)` or `error (...)`.

Cases run J at a time (--jobs) on the one GPU; MLX_PTX_CACHE_DIR is shared so
each fused kernel compiles once.

Usage: gpu_parity.py --archgen BIN --repo DIR --work DIR [--jobs J]
                     [--json FILE] CASE...
Prints one line per case as it finishes (`gpu-parity spec=...`), then the
markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parity import tensors  # noqa: E402  (name -> (dtype, shape, raw bytes))

# Two schedules over prompt ids below `vocab` (ids (i*37+seed) % vocab).
# "stagger": tests/batch_parity.rs's schedule (arrivals over 10 steps, one
# sequence cancelled in prefill and one while generating, 4-token prefill
# chunks). "chunks": longer prompts in 16-token chunks, four arriving at
# once, one late, one cancelled while generating.
def schedules(vocab: int) -> dict[str, dict]:
    def ids(n: int, seed: int) -> list[int]:
        return [(i * 37 + seed) % vocab for i in range(n)]

    return {
        "stagger": {
            "prefill_step_size": 4,
            "sequences": [
                {"prompt": ids(7, 11), "arrival": 0, "decode": 5},
                {"prompt": ids(3, 5), "arrival": 0, "decode": 3},
                {"prompt": ids(1, 2), "arrival": 2, "decode": 4},
                {"prompt": ids(10, 29), "arrival": 3, "decode": 3},
                {"prompt": ids(5, 41), "arrival": 4, "decode": 2},
                {"prompt": ids(2, 17), "arrival": 9, "decode": 3},
                {"prompt": ids(9, 3), "arrival": 1, "decode": 6, "leave": 4},
                {"prompt": ids(2, 7), "arrival": 5, "decode": 6, "leave": 8},
            ],
        },
        "chunks": {
            "prefill_step_size": 16,
            "sequences": [
                {"prompt": ids(40, 13), "arrival": 0, "decode": 6},
                {"prompt": ids(23, 19), "arrival": 0, "decode": 8},
                {"prompt": ids(5, 23), "arrival": 0, "decode": 4},
                {"prompt": ids(33, 31), "arrival": 0, "decode": 8, "leave": 6},
                {"prompt": ids(17, 37), "arrival": 3, "decode": 5},
            ],
        },
    }


WIDTH = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U32": 4, "I64": 8}
SKIP = {"prompt_ids"}  # inputs written beside the outputs, not results


def differences(a: Path, b: Path) -> tuple[int, int, list[str]]:
    """(values that differ, values compared, the tensors that differ) of two
    safetensors files, over the tensors they share; a tensor of another
    dtype or shape counts all its values."""
    ta, tb = tensors(a), tensors(b)
    n_diff, n_all, where = 0, 0, []
    for name in sorted(set(ta) | set(tb)):
        if name in SKIP:
            continue
        if name not in ta or name not in tb:
            where.append(f"{name} missing")
            continue
        (da, sa, xa), (db, sb, xb) = ta[name], tb[name]
        w = WIDTH.get(da, 1)
        count = len(xa) // w
        n_all += count
        if (da, sa) != (db, sb):
            n_diff += count
            where.append(f"{name} {da}{sa} vs {db}{sb}")
            continue
        if xa == xb:
            continue
        va = np.frombuffer(xa, dtype=f"u{w}")
        vb = np.frombuffer(xb, dtype=f"u{w}")
        k = int((va != vb).sum())
        n_diff += k
        where.append(f"{name} {k}")
    return n_diff, n_all, where


def describe(a: Path, b: Path) -> tuple[bool, str]:
    n, m, where = differences(a, b)
    if not where:
        return True, "identical"
    shown = ", ".join(where[:4]) + (f", +{len(where) - 4} more" if len(where) > 4 else "")
    return False, f"differs ({n} of {m} values: {shown})"


TIMEOUT = [150]  # seconds one process may run (--timeout)


def run(cmd: list[str], env=None, timeout=None) -> tuple[int, str]:
    timeout = timeout or TIMEOUT[0]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        return p.returncode, (p.stdout + p.stderr).strip()
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout} s"


def last_line(out: str) -> str:
    """The last line of a failure, without the source locations MLX and
    Rust append."""
    lines = [line for line in out.splitlines() if line.strip()]
    # archgen's errors end with a count ("1 error") after the error itself:
    # the first line that says `error:` is the one that explains.
    errors = [line for line in lines if "error:" in line]
    line = errors[0] if errors else lines[-1] if lines else "no output"
    return line.split(" at /")[0][-200:]


class Case:
    def __init__(self, a, text: str):
        name, L, N = text.split(":")
        # SPEC@DTYPE: the checkpoint's unquantized weights in DTYPE (init's
        # --dtype) rather than the spec's bfloat16.
        spec, _, dtype = name.partition("@")
        self.spec, self.dtype, self.L, self.N = spec, dtype, int(L), int(N)
        self.a = a
        self.dir = a.work / name.replace("@", "-")

    def archgen(self, args: list[str], out: Path) -> str | None:
        """None when `archgen` wrote `out`, else the cell's text."""
        rc, said = run([self.a.archgen, *args, "--out", str(out)])
        if rc == 0:
            return None
        if "no generated model" in said:
            return "n/a (no generated model)"
        return f"error ({last_line(said)})"

    def oracle(self, out: Path, sched: list[Path]) -> None:
        shutil.rmtree(out, ignore_errors=True)
        rc, said = run([sys.executable, str(self.a.here / "gpu_oracle.py"), str(self.model),
                        str(out), str(self.L), str(self.N), *map(str, sched)])
        if rc != 0:
            out.mkdir(parents=True, exist_ok=True)
            (out / "process.error").write_text(said[-2000:])

    def cell(self, impl: str, part: str, failed: str | None, oracle_run) -> str:
        """One cell: archgen's `impl` output for `part` (`single` or
        `batch-NAME`) against mlx-lm's. Where they differ, mlx-lm runs again
        in fresh processes (up to --oracle-runs in all; the one-sequence
        protocol also runs twice inside each) until two of its outputs differ
        or archgen equals one of them, and archgen runs once more, in a fresh
        process, to say whether it reproduces itself."""
        first = oracle_run(0)
        oracle_error = next((f"mlx-lm error ({last_line(e.read_text())})"
                             for e in (first / f"{part}.error", first / "process.error")
                             if e.exists()), None)
        if failed:
            return f"{failed}; {oracle_error}" if oracle_error else failed
        if oracle_error:
            return oracle_error
        ours = self.dir / f"{impl}-{part}.safetensors"
        same, text = describe(ours, first / f"{part}.safetensors")
        if same:
            return text
        # mlx-lm's outputs so far; each new one is compared with those
        # before it and with archgen's (the first one already was).
        theirs = [first / f"{part}.safetensors"]
        unstable = None
        equal_to = None

        def add(path: Path) -> None:
            nonlocal unstable, equal_to
            name = f"{path.parent.name}/{path.stem}"
            for earlier in theirs:
                if unstable is None:
                    same_output, text_of = describe(earlier, path)
                    if not same_output:
                        unstable = f"{earlier.parent.name}/{earlier.stem} vs {name}: {text_of[8:-1]}"
            if equal_to is None and describe(ours, path)[0]:
                equal_to = name
            theirs.append(path)

        if part == "single" and (first / "single-again.safetensors").exists():
            add(first / "single-again.safetensors")
        k = 1
        while not (unstable or equal_to) and k < self.a.oracle_runs:
            again = oracle_run(k)
            k += 1
            for name in (part, "single-again") if part == "single" else (part,):
                if (again / f"{name}.safetensors").exists():
                    add(again / f"{name}.safetensors")
        ours_again = self.archgen_again(impl, part)
        tail = f"; mlx-lm's outputs compared: {len(theirs)}; {ours_again}"
        if unstable:
            match = f"archgen equals {equal_to}" if equal_to else f"archgen {text}"
            return f"mlx-lm not reproducible ({unstable}); {match}{tail}"
        if equal_to:
            return f"identical to {equal_to}, not to mlx-lm's first run{tail}"
        return f"{text}{tail}"

    def archgen_again(self, impl: str, part: str) -> str:
        """archgen's `impl`/`part` run once more in a fresh process, compared
        with its first run."""
        args = self.commands[(impl, part)]
        again = self.dir / f"{impl}-{part}-again.safetensors"
        failed = self.archgen(args, again)
        if failed:
            return f"archgen's second run: {failed}"
        same, text = describe(self.dir / f"{impl}-{part}.safetensors", again)
        return "archgen's two runs identical" if same else f"archgen's two runs: {text}"

    def go(self) -> dict:
        t0 = time.time()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model = self.dir / "model"
        row = {"spec": f"{self.spec}@{self.dtype}" if self.dtype else self.spec, "L": self.L, "N": self.N}
        if not (self.model / "config.json").exists():
            dtype = ["--dtype", self.dtype] if self.dtype else []
            rc, said = run([self.a.archgen, "init", "--spec", str(self.a.specs / f"{self.spec}.yaml"),
                            "--out", str(self.model), "--seed", "1", *dtype])
            # MLX's CUDA backend can abort at process exit ("Destroy(handle_)
            # failed: driver shutting down") after the checkpoint is written.
            written = (self.model / "config.json").exists() and any(self.model.glob("*.safetensors"))
            if rc != 0 and not written:
                row["error"] = f"init failed: {last_line(said)}"
                return row
        config = json.loads((self.model / "config.json").read_text())
        vocab = config.get("text_config", config)["vocab_size"]
        ids = ",".join(str((i * 37 + 11) % vocab) for i in range(self.L))
        sched = []
        for name, s in schedules(vocab).items():
            p = self.dir / f"{name}.json"
            p.write_text(json.dumps(s))
            sched.append(p)
        oracle_dirs = [self.dir / f"mlx-lm-{k + 1}" for k in range(self.a.oracle_runs)]
        oracle_thread = threading.Thread(target=self.oracle, args=(oracle_dirs[0], sched))
        oracle_thread.start()
        failed = {}
        self.commands = {}
        for impl in ("generated", "monolith"):
            self.commands[(impl, "single")] = [
                "logits", "--model", str(self.model), "--prompt-ids", ids,
                "--decode-steps", str(self.N), "--impl", impl]
            for p in sched:
                self.commands[(impl, f"batch-{p.stem}")] = [
                    "logits", "--model", str(self.model), "--batch", str(p), "--impl", impl]
        for (impl, part), args in self.commands.items():
            failed[(impl, part)] = self.archgen(args, self.dir / f"{impl}-{part}.safetensors")
        oracle_thread.join()
        ran = {0}

        def oracle_run(k: int) -> Path:
            if k not in ran:
                self.oracle(oracle_dirs[k], sched)
                ran.add(k)
            return oracle_dirs[k]

        for (impl, part) in self.commands:
            row[f"{impl}/{part}"] = self.cell(impl, part, failed[(impl, part)], oracle_run)
        row["mlx-lm runs"] = len(ran)
        row["seconds"] = round(time.time() - t0)
        if not self.a.keep:
            shutil.rmtree(self.model, ignore_errors=True)
        return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archgen", required=True)
    ap.add_argument("--repo", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--oracle-runs", type=int, default=3,
                    help="fresh mlx-lm processes at most, where archgen differs from the first")
    ap.add_argument("--timeout", type=int, default=150,
                    help="seconds one archgen or mlx-lm process may run")
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    TIMEOUT[0] = a.timeout
    a.here = Path(__file__).resolve().parent
    a.work.mkdir(parents=True, exist_ok=True)
    a.specs = a.work / "specs"
    if not a.specs.exists():
        shutil.copytree(a.repo / "specs", a.specs)
    os.environ.setdefault("MLX_PTX_CACHE_DIR", str(a.work / "ptx-cache"))
    rows = []
    lock = threading.Lock()

    def one(text: str) -> None:
        try:
            row = Case(a, text).go()
        except Exception as e:  # one case must not hide the rest
            row = {"spec": text, "error": f"{type(e).__name__}: {e}"}
        with lock:
            rows.append(row)
            print("gpu-parity " + json.dumps(row), flush=True)
            if a.json:
                a.json.write_text(json.dumps(rows, indent=1))

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        list(pool.map(one, a.cases))
    order = {c.split(":")[0]: i for i, c in enumerate(a.cases)}
    rows.sort(key=lambda r: order.get(r["spec"], 0))
    cols = ["generated/single", "monolith/single", "generated/batch-stagger",
            "monolith/batch-stagger", "generated/batch-chunks", "monolith/batch-chunks"]
    print("\n| spec (prompt / steps) | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r in rows:
        if "error" in r:
            print(f"| {r['spec']} | " + r["error"] + " |" * len(cols))
            continue
        print(f"| {r['spec']} ({r['L']} / {r['N']}) | " + " | ".join(r.get(c, "") for c in cols) + " |")


if __name__ == "__main__":
    main()
