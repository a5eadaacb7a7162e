"""Serving benchmark: the pauses a long prompt's prefill puts on sequences
that are generating. One `archgen serve` on loopback; 8 clients stream long
answers (3,000 tokens, temperature 0); one second in, a ~12k-token prompt
arrives. Reports the gaps between the 8 clients' content chunks while that
prompt is in prefill (p50, p99, the longest) and the long prompt's time to
first token, as one JSON line (and to OUT).

usage (from the repository root, after tests/python/serve_bench.py made the
checkpoint with its tokenizer):
  .venv/bin/python tests/python/serve_long_prompt_gaps.py ARCHGEN MODEL_DIR \
      PREFILL_STEP_WHILE_GENERATING OUT.json
PREFILL_STEP_WHILE_GENERATING (`off` or a number of tokens) is passed to the
server as ARCHGEN_PREFILL_STEP_WHILE_GENERATING. Every request has a time
limit, and the server is stopped at the end.
"""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_bench as sb  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main() -> None:
    archgen, model, setting, out = sys.argv[1:5]
    port = sb.free_port()
    env = dict(os.environ, ARCHGEN_PREFILL_STEP_WHILE_GENERATING=setting)
    with open(out + ".server.log", "w") as log:
        server = subprocess.Popen(
            [archgen, "serve", "--model", model, "--port", str(port), "--max-batch", "16",
             "--prompt-cache-bytes", "0"], stdout=log, stderr=log, env=env)
        try:
            run(port, model, setting, out)
        finally:
            server.terminate()
            server.wait(30)


def run(port: int, model: str, setting: str, out: str) -> None:
    for _ in range(600):
        if sb.chat(port, sb.SHORT, 2, 5).ok:
            break
        time.sleep(0.1)
    text = sb.long_text(Tokenizer.from_file(os.path.join(model, "tokenizer.json")), 12000)
    results = [sb.Result() for _ in range(8)]
    clients = [threading.Thread(target=sb.chat, args=(port, f"{sb.SHORT} {sb.WORDS[i]}", 3000, 300),
                                kwargs={"into": results[i]}) for i in range(8)]
    for t in clients:
        t.start()
    time.sleep(1.0)
    long = sb.Result()
    sb.chat(port, text, 4, 600, into=long)
    for t in clients:
        t.join()
    first = long.chunk_times[0] if long.chunk_times else None
    gaps = sorted(b - a for r in results for a, b in zip(r.chunk_times, r.chunk_times[1:])
                  if a >= long.start and (first is None or b <= first))
    pct = (lambda q: gaps[min(len(gaps) - 1, int(q / 100 * len(gaps)))] * 1e3) if gaps else (lambda q: None)
    res = {"setting": setting, "long_ttft_s": (first - long.start) if first else None,
           "gaps_during_long_prefill": len(gaps), "gap_p50_ms": pct(50), "gap_p99_ms": pct(99),
           "gap_max_ms": gaps[-1] * 1e3 if gaps else None,
           "tokens_of_8_clients": sum(len(r.chunk_times) for r in results),
           "failed": sum(not r.ok for r in results) + (not long.ok)}
    print(json.dumps(res))
    with open(out, "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    main()
