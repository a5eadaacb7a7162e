"""The same chats sent to `archgen serve` and to `mlx_lm.server` (0.32.2) on
one checkpoint, one request at a time: what each server's prompt cache gave
(usage.prompt_tokens_details.cached_tokens) and the answer's tokens with
their log-probabilities. runtime/cli/tests/serve.rs compares the two.

usage: server_segments_check.py ARCHGEN_BASE_URL MODEL_DIR

mlx_lm.server is started here on a free loopback port and stopped at the
end. The chats share a system prompt, then repeat one conversation, so a
server that stores its cache where the system turns end and where the user
turn ends (mlx-lm's segments) computes only the new tokens; the
log-probabilities show whether the prompt was fed in the same chunks.
Prints one JSON object: {"archgen": [...], "mlx_lm": [...]}, one entry per
chat: {"prompt_tokens", "cached_tokens", "tokens", "logprobs"}.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

SYSTEM = "You are a helpful assistant. Answer the question in one sentence."
CHATS = [
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there! How are you today?"}],
    # The same system prompt, another question: the system segment's cache.
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me a joke about a cat."}],
    # The first chat again: the cache where its user turn ended.
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there! How are you today?"}],
    # No system turn.
    [{"role": "user", "content": "What is two plus two?"}],
    [{"role": "user", "content": "What is two plus two?"}],
]
# The request's template variables over the server's: with reasoning off,
# Qwen3's template closes an empty reasoning block, which on a tokenizer
# with reasoning markers is the prompt's tail segment.
NO_THINKING = {"enable_thinking": False}
CHATS += [(CHATS[0], NO_THINKING), (CHATS[1], NO_THINKING), (CHATS[3], NO_THINKING)]
MAX_TOKENS = 6
TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())


def ask(base: str, chat) -> dict:
    messages, kwargs = chat if isinstance(chat, tuple) else (chat, None)
    body = {
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 1,
    }
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    answer = post(base, "/v1/chat/completions", body)
    usage = answer["usage"]
    content = answer["choices"][0]["logprobs"]["content"]
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
        "tokens": [c["token"] for c in content],
        "logprobs": [c["logprob"] for c in content],
    }


def wait_ready(base: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"mlx_lm.server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("mlx_lm.server did not answer within 300 s")


def main() -> None:
    archgen, model = sys.argv[1], sys.argv[2]
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_lm.server", "--model", model, "--host", "127.0.0.1",
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        out = {"archgen": [ask(archgen, c) for c in CHATS], "mlx_lm": [ask(base, c) for c in CHATS]}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
