"""mlx-lm 0.32.2's own continuous batching (`mlx_lm.generate.BatchGenerator`)
run over a fixed schedule: the reference that `archgen logits --batch` and
tests/batch_parity.rs compare with, byte for byte (docs/parity.md, "Batches").

Usage: batch_oracle.py MODEL_DIR SCHEDULE.json OUT.safetensors [--gemma2-mask-each-row]

--gemma2-mask-each-row: mlx-lm's gemma2 attention with grouped K/V heads
adds a batch's mask [B, 1, L, S] to scores [B, kv_heads, repeats, L, S]
(a broadcast error unless B is 1 or kv_heads, and then the wrong rows);
with this flag the mask gets the one axis it lacks ([B, 1, 1, L, S]) before
the unchanged attention runs: the oracle of archgen's row-by-row masked
Gemma-2 batches (docs/parity.md, "Batches", Gemma-2).

SCHEDULE.json:
    {"prefill_step_size": 2048,       # optional, mlx-lm's default
     "prefill_batch_size": 8,         # optional, mlx-lm's default
     "completion_batch_size": 32,     # optional, mlx-lm's default
     "sequences": [{"prompt": [ids...], "arrival": STEP, "decode": N,
                    "leave": STEP}, ...]}     # "leave" optional

A generator step is one `BatchGenerator.next()` call. Sequence i is inserted
(`insert([prompt], max_tokens=[N])`) just before step `arrival`, sequences of
one step in schedule order; greedy sampling (mlx-lm's default sampler, argmax
of the logprobs); no stop tokens, so each sequence leaves after exactly N
tokens (finish_reason "length"), unless "leave" cancels it earlier:
`BatchGenerator.remove([uid])` just before that step, wherever the sequence is
(waiting, in prefill or generating).

Writes, for each sequence i (schedule order):
    seq{i}.logprobs  [N, vocab]  the logprobs rows the generator returned, in the
                                  compute dtype (logits - logsumexp(logits))
    seq{i}.tokens    [N] int32    the greedy tokens returned with them
    seq{i}.steps     [N] int32    the generator step that returned each token
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_logits import load  # noqa: E402  (compat.apply() inside)

from mlx_lm.generate import BatchGenerator  # noqa: E402


def run_schedule(model, schedule: dict) -> dict[str, mx.array]:
    seqs = schedule["sequences"]
    if not seqs:
        raise SystemExit("batch_oracle.py: the schedule has no sequences")
    options = {
        key: int(schedule[key])
        for key in ("prefill_step_size", "prefill_batch_size", "completion_batch_size")
        if key in schedule
    }
    gen = BatchGenerator(model, **options)
    rows: list[list[mx.array]] = [[] for _ in seqs]
    tokens: list[list[int]] = [[] for _ in seqs]
    steps: list[list[int]] = [[] for _ in seqs]
    seq_of_uid: dict[int, int] = {}
    uid_of_seq: dict[int, int] = {}
    active: set[int] = set()
    last_event = max(max(int(s["arrival"]), int(s.get("leave", 0))) for s in seqs)
    # Every sequence needs at most its prompt length plus N steps; bound the loop.
    limit = last_event + sum(len(s["prompt"]) + int(s["decode"]) + 2 for s in seqs)
    step = 0
    while step <= last_event or active:
        if step > limit:
            raise SystemExit(f"batch_oracle.py: the schedule did not finish within {limit} steps")
        for i, s in enumerate(seqs):
            if "leave" in s and int(s["leave"]) == step and i in active:
                gen.remove([uid_of_seq[i]])
                active.discard(i)
        for i, s in enumerate(seqs):
            if int(s["arrival"]) == step:
                (uid,) = gen.insert([list(map(int, s["prompt"]))], max_tokens=[int(s["decode"])])
                seq_of_uid[uid] = i
                uid_of_seq[i] = uid
                active.add(i)
        _, generated = gen.next()
        for r in generated:
            i = seq_of_uid[r.uid]
            rows[i].append(r.logprobs)
            tokens[i].append(int(r.token))
            steps[i].append(step)
            if r.finish_reason is not None:
                active.discard(i)
        step += 1
    gen.close()
    out: dict[str, mx.array] = {}
    # A sequence that left before its first token gets an empty [0, vocab]
    # in the dtype of the others' rows.
    some_row = next((r[0] for r in rows if r), None)
    if some_row is None:
        raise SystemExit("batch_oracle.py: no sequence returned a token")
    for i in range(len(seqs)):
        out[f"seq{i}.logprobs"] = (mx.stack(rows[i]) if rows[i]
                                   else mx.zeros((0, some_row.shape[0]), dtype=some_row.dtype))
        out[f"seq{i}.tokens"] = mx.array(tokens[i], dtype=mx.int32)
        out[f"seq{i}.steps"] = mx.array(steps[i], dtype=mx.int32)
    mx.eval(out)
    return out


def mask_gemma2_batches_each_row() -> None:
    """Gives gemma2's attention a batch mask with the repeats' axis."""
    from mlx_lm.models import gemma2

    unchanged = gemma2.Attention.__call__

    def call(self, x, mask=None, cache=None):
        if mask is not None and self.repeats > 1 and mask.ndim == 4 and mask.shape[0] > 1:
            mask = mx.expand_dims(mask, 2)
        return unchanged(self, x, mask, cache)

    gemma2.Attention.__call__ = call


def main() -> None:
    args = sys.argv[1:]
    if args[3:] == ["--gemma2-mask-each-row"]:
        mask_gemma2_batches_each_row()
        args = args[:3]
    if len(args) != 3:
        raise SystemExit(__doc__)
    model_dir, schedule_path, out_path = map(Path, args)
    schedule = json.loads(schedule_path.read_text())
    tensors = run_schedule(load(model_dir), schedule)
    meta = {"schedule": json.dumps(schedule), "mlx": mx.__version__}
    mx.save_safetensors(str(out_path), tensors, metadata=meta)


if __name__ == "__main__":
    main()
