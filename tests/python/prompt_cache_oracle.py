"""mlx-lm 0.32.2 computing a prompt as a cached prefix, then a suffix: the
reference for archgen serve's prompt cache (docs/parity.md, "Prompt cache";
tests/prompt_cache.rs compares with it byte for byte).

Usage: prompt_cache_oracle.py MODEL_DIR CASE.json OUT.safetensors

CASE.json:
    {"prefix": [ids...], "prefix_decode": K, "suffix": [ids...], "decode": N,
     "prefill_step_size": 2048,               # optional, mlx-lm's default
     "trim": T,                               # optional
     "fresh": [ids...], "other_prefix": [ids...]}   # optional, together

What mlx_lm.server does with two requests, the second's prompt extending the
first's prompt and answer: request 1 is `prefix`, answered with K greedy
tokens G; its cache then holds prefix + G (every returned token has been fed).
Request 2's prompt is prefix + G + suffix; the cache is found as the nearest
shorter entry (`LRUPromptCache.fetch_nearest_cache`) and only `suffix` is
computed, then N tokens are generated. Two ways mlx-lm computes it:

* `generate_step(prompt_cache=...)` (the server's one-by-one path,
  `_serve_single`): the prefix with a fresh cache for K tokens, then the
  suffix with the same cache for N tokens;
* `BatchGenerator` (the server's default, batched path): `insert([prefix])`,
  run until it finishes, its `Response.prompt_cache` (`extract`) then
  `insert([suffix], caches=[that cache], all_tokens=[...])`, each request
  alone in the batch.

and, for comparison only, the whole second prompt from a fresh cache
(`generate_step`), which the split need not equal.

Writes (greedy; logprobs = logits - logsumexp(logits), the compute dtype):
    step.first.logprobs [K, vocab], step.first.tokens [K] int32
    step.second.logprobs [N, vocab], step.second.tokens [N] int32
    batch.first.logprobs, batch.first.tokens, batch.second.logprobs,
    batch.second.tokens                                (the same, batched)
    batch.trimmed.logprobs, batch.trimmed.tokens       (with "trim" T, when the
        cache can be trimmed: a third prompt, prefix + G without its last T
        tokens + suffix, from the stored cache trimmed by T)
    other.first.logprobs, other.first.tokens, mixed.{cached,fresh,other}.
    {logprobs,tokens}       (with "fresh" and "other_prefix": request 2
        again, inserted in one step with a fresh request `fresh` and with
        `suffix` from the cache of `other_prefix` answered with K tokens,
        N tokens each: two given caches of different lengths merged with a
        new one)
    whole.logprobs [N, vocab], whole.tokens [N]        (no cache reused)
    cached_tokens [1] int32                            len(prefix) + K

and, when MODEL_DIR has a tokenizer.json, OUT.json: for each of the token
lists above (key without ".tokens"), {"ids", "text", "finish_reason"}: the
text a server returns for it (decoded up to the first end-of-sequence id of
generation_config.json; finish_reason "stop" when one came, else "length").
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_logits import load  # noqa: E402  (compat.apply() inside)

from mlx_lm.generate import BatchGenerator, generate_step  # noqa: E402
from mlx_lm.models.cache import (  # noqa: E402
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)


def stepped(model, prompt: list[int], n: int, cache, step_size: int):
    """generate_step run to its end (so every returned token is fed)."""
    rows, tokens = [], []
    for token, logprobs in generate_step(mx.array(prompt), model, max_tokens=n,
                                         prompt_cache=cache, prefill_step_size=step_size):
        rows.append(logprobs)
        tokens.append(int(token))
    return mx.stack(rows), tokens


def batched(gen: BatchGenerator, prompt: list[int], n: int, cache=None, all_tokens=None):
    """One request alone in the generator: its rows, tokens, and the cache
    and token list it finished with."""
    (uid,) = gen.insert([prompt], max_tokens=[n],
                        caches=None if cache is None else [cache],
                        all_tokens=None if all_tokens is None else [all_tokens])
    rows, tokens = [], []
    # A prompt takes at most len(prompt) steps, then one token per step.
    for _ in range(len(prompt) + n + 2):
        _, generated = gen.next()
        for r in generated:
            if r.uid != uid:
                raise SystemExit(f"prompt_cache_oracle.py: unexpected sequence {r.uid}")
            rows.append(r.logprobs)
            tokens.append(int(r.token))
            if r.finish_reason is not None:
                return mx.stack(rows), tokens, r.prompt_cache, r.all_tokens
    raise SystemExit("prompt_cache_oracle.py: the request did not finish")


def batched_many(gen: BatchGenerator, prompts, n: int, caches, all_tokens):
    """Requests inserted together, each with its cache or None (fresh):
    each one's rows and tokens."""
    uids = gen.insert(prompts, max_tokens=[n] * len(prompts), caches=caches,
                      all_tokens=all_tokens)
    rows = {u: [] for u in uids}
    tokens = {u: [] for u in uids}
    done = set()
    for _ in range(sum(len(p) for p in prompts) + n + 2):
        _, generated = gen.next()
        for r in generated:
            rows[r.uid].append(r.logprobs)
            tokens[r.uid].append(int(r.token))
            if r.finish_reason is not None:
                done.add(r.uid)
        if len(done) == len(uids):
            return [(mx.stack(rows[u]), tokens[u]) for u in uids]
    raise SystemExit("prompt_cache_oracle.py: the requests did not finish")


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    model_dir, case_path, out_path = map(Path, sys.argv[1:])
    case = json.loads(case_path.read_text())
    prefix = [int(t) for t in case["prefix"]]
    suffix = [int(t) for t in case["suffix"]]
    k, n = int(case["prefix_decode"]), int(case["decode"])
    step_size = int(case.get("prefill_step_size", 2048))
    if not prefix or not suffix or k < 1 or n < 1:
        raise SystemExit("prompt_cache_oracle.py: prefix, suffix non-empty; prefix_decode, decode >= 1")
    model = load(model_dir)
    out: dict[str, mx.array] = {}

    cache = make_prompt_cache(model)
    rows, first = stepped(model, prefix, k, cache, step_size)
    out["step.first.logprobs"], out["step.first.tokens"] = rows, mx.array(first, dtype=mx.int32)
    rows, second = stepped(model, suffix, n, cache, step_size)
    out["step.second.logprobs"], out["step.second.tokens"] = rows, mx.array(second, dtype=mx.int32)

    gen = BatchGenerator(model, prefill_step_size=step_size)
    rows, b_first, stored, all_tokens = batched(gen, prefix, k)
    if all_tokens != prefix + b_first:
        raise SystemExit(f"prompt_cache_oracle.py: the stored tokens {all_tokens} "
                         f"are not the prefix and its answer {prefix + b_first}")
    out["batch.first.logprobs"], out["batch.first.tokens"] = rows, mx.array(b_first, dtype=mx.int32)
    # The server deep-copies what it fetches (`fetch_nearest_cache`).
    kept = copy.deepcopy(stored)
    mixed_cache = copy.deepcopy(stored)
    rows, b_second, _, _ = batched(gen, suffix, n, stored, all_tokens)
    out["batch.second.logprobs"] = rows
    out["batch.second.tokens"] = mx.array(b_second, dtype=mx.int32)
    if "fresh" in case:
        # Request 2 admitted in one step with a fresh request and a request
        # from another stored cache (`other_prefix` and its K tokens,
        # shorter): one `_merge_caches` of two given caches and a new one.
        fresh = [int(t) for t in case["fresh"]]
        other = [int(t) for t in case["other_prefix"]]
        rows, o_first, o_stored, o_tokens = batched(gen, other, k)
        out["other.first.logprobs"] = rows
        out["other.first.tokens"] = mx.array(o_first, dtype=mx.int32)
        got = batched_many(gen, [suffix, fresh, suffix], n, [mixed_cache, None, o_stored],
                           [all_tokens, [], o_tokens])
        for name, (rows, tokens) in zip(("cached", "fresh", "other"), got):
            out[f"mixed.{name}.logprobs"] = rows
            out[f"mixed.{name}.tokens"] = mx.array(tokens, dtype=mx.int32)
    trim = int(case.get("trim", 0))
    if trim > 0 and can_trim_prompt_cache(kept):
        # A prompt that leaves the stored sequence `trim` tokens before its
        # end: the stored cache trimmed (`trim_prompt_cache`), then `suffix`.
        trim_prompt_cache(kept, trim)
        cut = all_tokens[:-trim]
        rows, b_trimmed, _, _ = batched(gen, suffix, n, kept, cut)
        out["batch.trimmed.logprobs"] = rows
        out["batch.trimmed.tokens"] = mx.array(b_trimmed, dtype=mx.int32)
    gen.close()

    rows, whole = stepped(model, prefix + first + suffix, n, make_prompt_cache(model), step_size)
    out["whole.logprobs"], out["whole.tokens"] = rows, mx.array(whole, dtype=mx.int32)
    out["cached_tokens"] = mx.array([len(prefix) + k], dtype=mx.int32)
    mx.eval(out)
    meta = {"case": json.dumps(case), "mlx": mx.__version__}
    mx.save_safetensors(str(out_path), out, metadata=meta)
    if (model_dir / "tokenizer.json").is_file():
        write_texts(model_dir, out, out_path.with_suffix(".json"))


def write_texts(model_dir: Path, out: dict[str, mx.array], path: Path) -> None:
    """What a server answers for each token list: the text up to the first
    end-of-sequence id (generation_config.json's eos_token_id, as archgen
    serve reads it), and whether one came."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eos: set[int] = set()
    gen_config = model_dir / "generation_config.json"
    if gen_config.is_file():
        ids = json.loads(gen_config.read_text()).get("eos_token_id", [])
        eos = set(ids if isinstance(ids, list) else [ids])
    texts = {}
    for key, value in out.items():
        if not key.endswith(".tokens"):
            continue
        ids = value.tolist()
        stop = next((i for i, t in enumerate(ids) if t in eos), None)
        kept = ids if stop is None else ids[:stop]
        texts[key.removesuffix(".tokens")] = {
            "ids": ids,
            "text": tokenizer.decode(kept, skip_special_tokens=False),
            "finish_reason": "length" if stop is None else "stop",
        }
    path.write_text(json.dumps(texts, indent=1))


if __name__ == "__main__":
    main()
