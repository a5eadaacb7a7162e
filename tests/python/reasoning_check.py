"""One chat sent to `archgen serve` and to `mlx_lm.server` (0.32.2), whole
and streamed, on a model that writes a fixed answer with reasoning markers
(make_tool_call_model.py): how each server split the answer into
reasoning, content and tool calls. runtime/cli/tests/serve.rs compares the
two and checks the split itself.

usage: reasoning_check.py ARCHGEN_BASE_URL MODEL_DIR [--tools]

--tools offers a tool, so tool-call markup in the answer is read as a call.
Prints one JSON object: {"archgen": {"whole": A, "stream": A},
"mlx_lm": {...}}, each A {"reasoning", "content", "tool_calls":
[[name, arguments]], "finish_reason"}; a streamed A joins the deltas.
"""

from __future__ import annotations

import json
import sys

from mlx_lm_server import mlx_lm_server, post, post_stream

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
MAX_TOKENS = 16


def calls_of(calls) -> list:
    return [[c["function"]["name"], json.loads(c["function"]["arguments"])] for c in calls or []]


def ask(base: str, tools: bool) -> dict:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS, "temperature": 0}
    if tools:
        body["tools"] = TOOLS
    choice = post(base, "/v1/chat/completions", body)["choices"][0]
    message = choice["message"]
    whole = {
        "reasoning": message.get("reasoning") or "",
        "content": message.get("content") or "",
        "tool_calls": calls_of(message.get("tool_calls")),
        "finish_reason": choice["finish_reason"],
    }
    stream = {"reasoning": "", "content": "", "tool_calls": [], "finish_reason": None}
    for event in post_stream(base, "/v1/chat/completions", body):
        for c in event.get("choices", []):
            delta = c.get("delta", {})
            stream["reasoning"] += delta.get("reasoning") or ""
            stream["content"] += delta.get("content") or ""
            stream["tool_calls"] += calls_of(delta.get("tool_calls"))
            stream["finish_reason"] = c.get("finish_reason") or stream["finish_reason"]
    return {"whole": whole, "stream": stream}


def main() -> None:
    archgen, model = sys.argv[1], sys.argv[2]
    tools = "--tools" in sys.argv[3:]
    with mlx_lm_server(model) as base:
        out = {"archgen": ask(archgen, tools), "mlx_lm": ask(base, tools)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
