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
import sys

from mlx_lm_server import mlx_lm_server, post

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


def main() -> None:
    archgen, model = sys.argv[1], sys.argv[2]
    with mlx_lm_server(model) as base:
        out = {"archgen": [ask(archgen, c) for c in CHATS], "mlx_lm": [ask(base, c) for c in CHATS]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
