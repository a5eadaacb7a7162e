"""mlx-lm 0.32.2 benchmark worker for `cargo xtask bench`: the same stdin/stdout
protocol as the Rust worker (runtime/bench/src/main.rs), one JSON object per line.

After loading (mlx_lm.utils.load_model, as oracle_logits.load) and one
evaluated 1-token forward on a throwaway cache, it prints
{"ready": true, "impl": "mlx-lm", "load_s", "vmhwm_kb", "mlx", "mlx_lm"}, then answers:
  prefill N   fresh cache (make_prompt_cache), one forward over N prompt ids,
              mx.eval of the logits -> {"prefill_s": T}
  steps W S   W untimed then S timed one-token steps, pipelined as
              mlx_lm.generate.generate_step runs them (the Rust worker does the
              same): the argmax token stays lazy, step n+1 is queued with
              mx.async_eval before step n's token is read; a step's time is the
              interval between two tokens becoming available
              -> {"steps_s": [T...], "tokens": [...]} (the W + S tokens fed)
  steps W S sequential
              the same, one step at a time: forward + mx.eval of the logits row
              timed alone, the argmax outside the timed span
  nodes       one more step, its graph's primitive nodes counted before
              evaluation (mx.export_to_dot) -> {"nodes": N, "by_op": {...}}
  dot prefill N FILE
              fresh cache, one forward over N prompt ids; the graph of the
              logits ([N, vocab]) written to FILE as DOT (mx.export_to_dot)
              before it is evaluated; then evaluated, and its cache is the one
              steps / dot step extend -> {"dot": FILE, "nodes": N}
  dot step FILE
              one more decode step (the argmax of the last logits row), its
              logits row's graph written to FILE the same way
              -> {"dot": FILE, "nodes": N}
              (runtime/mlx-cuda/graph_diff.py compares two such files)
  batch B P W S
              batched decode through mlx-lm's own BatchGenerator (its
              defaults: prefill step 2048, prefill batch 8, completion batch
              32; greedy): B sequences of P prompt ids (sequence j's ids
              shifted by 101 * j, as the Rust worker's `batch`) inserted at
              once; next() runs untimed until one call returns a token for
              all B, then W untimed and S timed calls; a step's time is the
              interval between two next() returns (the generator pipelines:
              each call queues the next forward before reading this one's
              tokens) -> {"batch": B, "fill_s": T, "steps_s": [T...],
              "tokens": [[B tokens]...]} (timed steps, in sequence order);
              the sequences are then removed
  quit
Prompt ids are (i * 37 + 11) % vocab, as in the parity tests.

Usage: bench_mlx_lm.py --model DIR
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_logits import load  # noqa: E402


def vmhwm_kb() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def batched_steps(model, vocab: int, b: int, p: int, warm: int, timed: int) -> dict:
    """`batch B P W S` (see the module docstring)."""
    from mlx_lm.generate import BatchGenerator

    if b < 1 or p < 1:
        raise SystemExit(f"batch: B and P must be at least 1 (got {b}, {p})")
    # No sequence reaches this budget before the timed steps end (the first
    # ones start generating while later ones still prefill).
    budget = warm + timed + p + b + 8
    # Room for all B in the generation batch (its default holds 32), as the
    # Rust worker's session.
    gen = BatchGenerator(model, completion_batch_size=max(32, b))
    prompts = [[(i * 37 + 11 + 101 * j) % vocab for i in range(p)] for j in range(b)]
    started = time.perf_counter()
    uids = gen.insert(prompts, max_tokens=[budget] * b)
    seq_of = {uid: j for j, uid in enumerate(uids)}
    steps = 0
    while len(gen.next()[1]) < b:
        steps += 1
        if steps > budget:
            raise SystemExit(f"batch {b}: not all sequences were generating after {steps} steps")
    fill_s = time.perf_counter() - started
    times, tokens = [], []
    since = time.perf_counter()
    for i in range(warm + timed):
        generated = gen.next()[1]
        now = time.perf_counter()
        elapsed, since = now - since, now
        if len(generated) != b or any(r.finish_reason is not None for r in generated):
            raise SystemExit(f"batch {b}: step {i} returned {len(generated)} tokens, expected {b} running")
        if i >= warm:
            times.append(elapsed)
            row = [0] * b
            for r in generated:
                row[seq_of[r.uid]] = int(r.token)
            tokens.append(row)
    gen.remove(uids)
    gen.close()
    return {"batch": b, "fill_s": fill_s, "steps_s": times, "tokens": tokens}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, type=Path)
    a = p.parse_args()
    model = load(a.model)
    # As the Rust worker: one evaluated 1-token forward on a throwaway cache,
    # so every weight is read before "ready" (load_model evaluates them anyway).
    mx.eval(model(mx.array([[0]], dtype=mx.int32), cache=make_prompt_cache(model)))
    reply({"ready": True, "impl": "mlx-lm", "load_s": time.perf_counter() - START,
           "vmhwm_kb": vmhwm_kb(), "mlx": mx.__version__,
           "mlx_lm": mlx_lm.__version__})
    with open(a.model / "config.json") as f:
        config = json.load(f)
    vocab = config.get("text_config", config)["vocab_size"]
    cache, last = None, None
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "prefill":
            n = int(words[1])
            cache = make_prompt_cache(model)
            ids = mx.array([(i * 37 + 11) % vocab for i in range(n)], dtype=mx.int32)[None]
            mx.eval(ids)
            t = time.perf_counter()
            logits = model(ids, cache=cache)[0]
            mx.eval(logits)
            secs = time.perf_counter() - t
            last = logits[-1]
            reply({"prefill_s": secs})
        elif words[0] == "steps" and words[3:] == ["sequential"]:
            # One step at a time (the Rust worker's `sequential`): forward +
            # mx.eval of the logits row timed alone, the argmax outside.
            warm, timed = int(words[1]), int(words[2])
            times, tokens = [], []
            for i in range(warm + timed):
                tok = int(mx.argmax(last, axis=-1).item())
                tokens.append(tok)
                x = mx.array([[tok]], dtype=mx.int32)
                mx.eval(x)
                t = time.perf_counter()
                row = model(x, cache=cache)[0, -1]
                mx.eval(row)
                if i >= warm:
                    times.append(time.perf_counter() - t)
                last = row
            reply({"steps_s": times, "tokens": tokens})
        elif words[0] == "steps" and words[3:] in ([], ["pipelined"]):
            # Pipelined as mlx_lm.generate.generate_step: the token stays a
            # lazy array fed to the next forward; step n+1 is queued with
            # mx.async_eval before step n's token is read. A step's time is
            # the interval between two tokens becoming available.
            warm, timed = int(words[1]), int(words[2])
            intervals, tokens = [], []
            y = mx.argmax(last, axis=-1).astype(mx.int32).reshape(1, 1)
            mx.async_eval(y)
            since = time.perf_counter()
            for i in range(warm + timed):
                row = model(y, cache=cache)[0, -1]
                next_y = mx.argmax(row, axis=-1).astype(mx.int32).reshape(1, 1)
                mx.async_eval(row, next_y)
                tokens.append(y.item())
                if i > 0:
                    now = time.perf_counter()
                    intervals.append(now - since)
                    since = now
                last, y = row, next_y
            y.item()
            mx.eval(last)
            intervals.append(time.perf_counter() - since)
            reply({"steps_s": intervals[warm:], "tokens": tokens})
        elif words[0] == "nodes":
            # One decode step's graph, counted before it is evaluated: the
            # primitive nodes export_to_dot lists, by operation.
            tok = int(mx.argmax(last, axis=-1).item())
            row = model(mx.array([[tok]], dtype=mx.int32), cache=cache)[0, -1]
            with tempfile.TemporaryDirectory() as d:
                path = Path(d) / "step.dot"
                mx.export_to_dot(str(path), row)
                ops = re.findall(r'\[label ="([^"]*)", shape=rectangle\]', path.read_text())
            mx.eval(row)
            last = row
            by_op = dict(sorted(collections.Counter(ops).items()))
            reply({"nodes": len(ops), "by_op": by_op})
        elif words[0] == "dot" and (words[1:2] == ["prefill"] and len(words) == 4
                                    or words[1:2] == ["step"] and len(words) == 3):
            if words[1] == "prefill":
                cache = make_prompt_cache(model)
                n = int(words[2])
                ids = mx.array([(i * 37 + 11) % vocab for i in range(n)], dtype=mx.int32)[None]
                mx.eval(ids)
                logits = model(ids, cache=cache)[0]
            else:
                if last is None:
                    raise SystemExit("dot step before prefill")
                tok = int(mx.argmax(last, axis=-1).item())
                logits = model(mx.array([[tok]], dtype=mx.int32), cache=cache)[0, -1]
            path = Path(words[-1])
            mx.export_to_dot(str(path), logits)
            ops = re.findall(r'\[label ="([^"]*)", shape=rectangle\]', path.read_text())
            mx.eval(logits)
            last = logits[-1] if logits.ndim == 2 else logits
            reply({"dot": str(path), "nodes": len(ops)})
        elif words[0] == "batch" and len(words) == 5:
            reply(batched_steps(model, vocab, *map(int, words[1:])))
        else:
            raise SystemExit(f"unknown command {line.strip()!r}")


if __name__ == "__main__":
    main()
