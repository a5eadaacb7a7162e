"""Asks `archgen serve`, through the official openai client, a model that
writes one tool call (make_tool_call_model.py): the answer must carry it as
OpenAI's `tool_calls`, whole and streamed, as mlx_lm.server returns it.

usage: tool_call_client.py BASE_URL

Exits non-zero with the failed check; prints {"tool_calls": "checked"}.
"""

import json
import sys

import openai

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def check(cond, what):
    if not cond:
        raise SystemExit(f"check failed: {what}")


def main() -> None:
    client = openai.OpenAI(base_url=sys.argv[1], api_key="not-needed", timeout=120, max_retries=0)
    name = client.models.list().data[0].id

    r = client.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS, max_tokens=16, temperature=0)
    choice = r.choices[0]
    check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason}: {r}")
    calls = choice.message.tool_calls or []
    check(len(calls) == 1, f"one tool call: {choice.message}")
    call = calls[0]
    check(call.type == "function" and call.function.name == "get_weather", str(call))
    check(json.loads(call.function.arguments) == {"city": "Paris"}, call.function.arguments)
    check(call.id, f"the call has an id: {call}")
    check(not (choice.message.content or "").strip(), f"the markup is not left in content: {choice.message}")

    chunks = list(client.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS, max_tokens=16,
                                                 temperature=0, stream=True))
    streamed = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    check(len(streamed) >= 1 and streamed[0].function.name == "get_weather", str(chunks))
    arguments = "".join(t.function.arguments or "" for t in streamed)
    check(json.loads(arguments) == {"city": "Paris"}, arguments)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(not text.strip(), f"no markup streamed as content: {text!r}")
    check(chunks[-1].choices[0].finish_reason == "tool_calls", str(chunks[-1]))

    # tool_choice "none": the tools are not offered, so the same text is
    # plain content.
    n = client.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                       max_tokens=16, temperature=0)
    check(not n.choices[0].message.tool_calls, str(n))
    print(json.dumps({"tool_calls": "checked"}))


if __name__ == "__main__":
    main()
