"""Checks `archgen serve` with the official openai client, as a user would
call it (completions, chat, embeddings). Asserts as it goes (a failed check exits non-zero with its message)
and prints the texts the Rust test compares with `archgen generate` and
`archgen chat` as JSON.

usage: openai_client_check.py BASE_URL MODEL_DIR (PROMPT_IDS | --tools-only)
  BASE_URL    e.g. http://127.0.0.1:40123/v1
  MODEL_DIR   the served checkpoint (its tokenizer counts the prompt tokens)
  PROMPT_IDS  comma-separated token ids for the greedy/seeded comparisons
  --tools-only  only the checks of `tools=` (another model's chat template)
"""

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import openai  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from mlx_lm.tokenizer_utils import TokenizerWrapper  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def check(cond, what):
    if not cond:
        raise SystemExit(f"check failed: {what}")


def check_tools(client, name, hf, messages) -> None:
    # Tools: the template renders them (the prompt is transformers'
    # apply_chat_template(tools=...) token for token, so longer than without),
    # a history with an assistant tool call and a tool answer renders as
    # transformers renders it, and the answer is well-formed in both modes.
    # (A random-weight model writes no tool markup: the calls a model writes
    # are checked with a model built to write one, tool_call_client.py.)
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

    def hf_count(msgs, **kw):
        ids = hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, **kw)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    plain = client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0)
    tc = client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                        tools=tools, tool_choice="auto")
    check(tc.usage.prompt_tokens == hf_count(messages, tools=tools),
          f"tools prompt_tokens {tc.usage.prompt_tokens} vs transformers {hf_count(messages, tools=tools)}")
    check(tc.usage.prompt_tokens > plain.usage.prompt_tokens + 20,
          f"tools grew the prompt: {tc.usage.prompt_tokens} vs {plain.usage.prompt_tokens}")
    choice = tc.choices[0]
    check(choice.message.role == "assistant" and choice.finish_reason in ("stop", "length", "tool_calls"), str(tc))
    for call in choice.message.tool_calls or []:
        check(call.type == "function" and isinstance(json.loads(call.function.arguments), dict), str(call))
    check((choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls), str(choice))
    chunks = list(client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                                 tools=tools, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    streamed_calls = [t.function.name for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    check(streamed == (choice.message.content or ""), f"streamed {streamed!r} vs {choice.message.content!r}")
    check(streamed_calls == [t.function.name for t in choice.message.tool_calls or []], str(chunks))
    check(chunks[-1].choices[0].finish_reason == choice.finish_reason, str(chunks[-1]))
    # tool_choice "none": the template is not given the tools.
    none = client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                          tools=tools, tool_choice="none")
    check(none.usage.prompt_tokens == plain.usage.prompt_tokens, f"{none.usage} vs {plain.usage}")
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call-1", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
               {"role": "tool", "tool_call_id": "call-1", "content": json.dumps({"temp": 21})}]
    hist = client.chat.completions.create(model=name, messages=history, max_tokens=4, temperature=0, tools=tools)
    hf_history = [dict(m) for m in history]
    hf_history[1] = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    check(hist.usage.prompt_tokens == hf_count(hf_history, tools=tools),
          f"history prompt_tokens {hist.usage.prompt_tokens} vs {hf_count(hf_history, tools=tools)}")
    # tool_choice "required" and a named function: a grammar holds the
    # answer to one call in the template's markup (Qwen's <tool_call> JSON,
    # Gemma 4's <|tool_call>call:NAME{...}), arguments valid against the
    # tool's parameters. The strings are bounded so that a random-weight
    # model's call closes within max_tokens.
    bounded = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 3},
                                             "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "days", "unit"], "additionalProperties": False}}},
               {"type": "function", "function": {"name": "now"}}]
    for seed, tool_choice in [(3, "required"), (4, {"type": "function", "function": {"name": "get_weather"}})]:
        for stream in (False, True):
            asked = dict(model=name, messages=messages, max_tokens=160, seed=seed, tools=bounded,
                         tool_choice=tool_choice)
            if stream:
                chunks = list(client.chat.completions.create(stream=True, **asked))
                calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
                finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
                what = f"{tool_choice}, streamed: {chunks}"
            else:
                answer = client.chat.completions.create(**asked)
                calls = answer.choices[0].message.tool_calls or []
                finish = [answer.choices[0].finish_reason]
                what = f"{tool_choice}: {answer}"
            check(finish == ["tool_calls"] and len(calls) == 1, what)
            call = calls[0]
            arguments = json.loads(call.function.arguments)
            if call.function.name == "now":
                check(tool_choice == "required" and arguments == {}, what)
                continue
            check(call.function.name == "get_weather" and isinstance(arguments.get("city"), str)
                  and len(arguments["city"]) <= 8 and arguments.get("days") in (1, 2, 3)
                  and arguments.get("unit") in ("c", "f"), what)
    if "<|tool_call>" in (hf.chat_template or ""):
        # Gemma 4's grammar is translated from the schema: a keyword it does
        # not serve is a 400 naming its path.
        patterned = [{"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}},
            "required": ["code"]}}}]
        try:
            client.chat.completions.create(model=name, messages=messages, max_tokens=8, tools=patterned,
                                           tool_choice="required")
            check(False, "a pattern was accepted for Gemma 4's tool-call grammar")
        except openai.BadRequestError as e:
            check(e.param == "tools[0].function.parameters.properties.code.pattern", str(e))

def main() -> None:
    base_url, model_dir = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url, api_key="not-needed", timeout=120, max_retries=0)
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    # transformers' apply_chat_template as mlx-lm calls it: its wrapper sets
    # enable_thinking from the tokenizer's reasoning markers.
    hf = TokenizerWrapper(AutoTokenizer.from_pretrained(model_dir, local_files_only=True))
    out = {}

    models = client.models.list().data
    check(len(models) == 1, f"one model listed, got {models}")
    name = models[0].id
    messages = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hello there"}]
    if sys.argv[3] == "--tools-only":
        check_tools(client, name, hf, messages)
        print(json.dumps({"tools": "checked"}))
        return
    prompt_ids = [int(t) for t in sys.argv[3].split(",")]

    # Completions: greedy, usage counted with the tokenizer, finish_reason.
    prompt = "The quick brown fox"
    c = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0)
    text, finish = c.choices[0].text, c.choices[0].finish_reason
    check(c.object == "text_completion", c.object)
    check(c.usage.prompt_tokens == len(tok.encode(prompt).ids), f"prompt_tokens {c.usage}")
    check(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens, f"total {c.usage}")
    check(finish in ("stop", "length"), finish)
    if finish == "length":
        check(c.usage.completion_tokens == 12, f"length finish after 12 tokens: {c.usage}")
    check(len(text) >= 4, f"a greedy completion long enough to cut: {text!r}")

    # Streaming gives the same text, then the usage chunk.
    chunks = list(
        client.completions.create(
            model=name, prompt=prompt, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    check(streamed == text, f"streamed {streamed!r} != {text!r}")
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(finishes == [finish], f"one finish_reason chunk: {finishes}")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == c.usage.completion_tokens,
          f"usage chunk last: {chunks[-1]}")
    check(len(chunks) >= 3, f"text arrives in several chunks: {len(chunks)}")

    # Requests at once: each gets the text it would get alone (the scheduler
    # interleaves them; each sequence computes as it would alone).
    with ThreadPoolExecutor(4) as pool:
        def greedy(_):
            return client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0).choices[0].text
        together = list(pool.map(greedy, range(4)))
    check(together == [text] * 4, f"concurrent requests: {together}")

    # A client that leaves a stream early does not stop the server.
    with client.completions.create(model=name, prompt=prompt, max_tokens=400, temperature=0, stream=True) as s:
        for i, _ in enumerate(s):
            if i == 2:
                break

    # stop: a string from the middle of the greedy text cuts it there.
    mid = len(text) // 2
    stop = text[mid:mid + 2]
    cut = text[: text.index(stop)]
    for stream in (False, True):
        r = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0,
                                      stop=[stop, "never-appears"], stream=stream)
        got = "".join(ch.choices[0].text for ch in r) if stream else r.choices[0].text
        check(got == cut, f"stop {stop!r} (stream={stream}): {got!r} != {cut!r}")
        if not stream:
            check(r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
    r = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0, stop=stop)
    check(r.choices[0].text == cut, "stop as one string")

    # seed: the same seed gives the same sample, another seed another one
    # (temperature 3: a random-weight model's distribution is too peaked at 1).
    def sampled(seed):
        return client.completions.create(model=name, prompt=prompt, max_tokens=16, temperature=3.0,
                                         top_p=0.95, seed=seed).choices[0].text
    a, b, other = sampled(7), sampled(7), sampled(8)
    check(a == b, f"seed 7 twice: {a!r} != {b!r}")
    check(a != other, f"seeds 7 and 8 gave the same text {a!r}")

    # logprobs (completions): one entry per token, the greedy token the most
    # likely of its top alternatives, text_offset counting the text, and the
    # same entries streamed.
    lp = client.completions.create(model=name, prompt=prompt, max_tokens=6, temperature=0, logprobs=3)
    L = lp.choices[0].logprobs
    check(L is not None and len(L.tokens) == lp.usage.completion_tokens, f"one logprob per token: {L}")
    # A token that is part of a character is labelled `bytes:\xNN...`.
    def label_bytes(label):
        if label.startswith("bytes:\\x"):
            return bytes.fromhex(label[len("bytes:"):].replace("\\x", ""))
        return label.encode()
    spelled = b"".join(label_bytes(t) for t in L.tokens).decode("utf-8", errors="replace")
    check(spelled == lp.choices[0].text, f"tokens {L.tokens} make the text {lp.choices[0].text!r}")
    # Each token counts the characters it decodes to alone (a part of a
    # character: one U+FFFD).
    lengths = [len(label_bytes(t).decode("utf-8", errors="replace")) for t in L.tokens]
    offsets = [sum(lengths[:i]) for i in range(len(L.tokens))]
    check(L.text_offset == offsets, f"text_offset {L.text_offset} != {offsets}")
    for token, logprob, top in zip(L.tokens, L.token_logprobs, L.top_logprobs):
        check(logprob <= 0 and 1 <= len(top) <= 3, f"{token!r}: {logprob} {top}")
        check(max(top.values()) == logprob, f"greedy {token!r} ({logprob}) is the most likely of {top}")
    chunks = list(client.completions.create(model=name, prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                                            stream=True))
    streamed = [lp for ch in chunks if ch.choices and ch.choices[0].logprobs
                for lp in ch.choices[0].logprobs.token_logprobs]
    check(streamed == L.token_logprobs, f"streamed logprobs {streamed} != {L.token_logprobs}")
    check(client.completions.create(model=name, prompt=prompt, max_tokens=2).choices[0].logprobs is None,
          "no logprobs unless asked")
    try:
        client.completions.create(model=name, prompt=prompt, max_tokens=2, logprobs=6)
        check(False, "logprobs=6 was accepted")
    except openai.BadRequestError as e:
        check("logprobs" in str(e), str(e))

    # Token-id prompts, for the Rust side to compare with `archgen generate`.
    g = client.completions.create(model=name, prompt=prompt_ids, max_tokens=10, temperature=0)
    check(g.usage.prompt_tokens == len(prompt_ids), f"id prompt tokens: {g.usage}")
    out["greedy_ids"] = g.choices[0].text
    s = client.completions.create(model=name, prompt=prompt_ids, max_tokens=10, temperature=3.0, top_p=0.95, seed=7)
    out["seeded_ids"] = s.choices[0].text

    # Chat: the prompt is the chat template as mlx-lm renders it.
    ch = client.chat.completions.create(model=name, messages=messages, max_tokens=10, temperature=0)
    reply = ch.choices[0].message.content
    check(ch.object == "chat.completion" and ch.choices[0].message.role == "assistant", str(ch))
    want_ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(want_ids, dict) or hasattr(want_ids, "keys"):
        want_ids = want_ids["input_ids"]
    check(ch.usage.prompt_tokens == len(want_ids), f"chat prompt_tokens {ch.usage} vs {len(want_ids)}")
    check(ch.usage.total_tokens == ch.usage.prompt_tokens + ch.usage.completion_tokens, str(ch.usage))
    chunks = list(client.chat.completions.create(model=name, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    check(chunks[0].choices[0].delta.role == "assistant", f"first delta has the role: {chunks[0]}")
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    check(streamed == reply, f"streamed chat {streamed!r} != {reply!r}")
    check(chunks[-1].choices[0].finish_reason == ch.choices[0].finish_reason, "chat finish_reason")
    if len(reply) >= 3:
        stop = reply[1:3]
        r = client.chat.completions.create(model=name, messages=messages, max_tokens=10, temperature=0, stop=stop)
        check(r.choices[0].message.content == reply[: reply.index(stop)], "chat stop")
        check(r.choices[0].finish_reason == "stop", "chat stop finish_reason")

    # logprobs (chat): content entries with bytes and top_logprobs.
    lc = client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                        logprobs=True, top_logprobs=2)
    content = lc.choices[0].logprobs.content
    check(len(content) == lc.usage.completion_tokens, f"one entry per token: {content}")
    # The tokens' bytes spell the reply; a token that is part of a character
    # is labelled by its bytes (OpenAI's `bytes:\xNN`), any other by its text.
    spelled = b"".join(bytes(e.bytes) for e in content).decode("utf-8", errors="replace")
    check(spelled == lc.choices[0].message.content, f"entries make the reply: {spelled!r}")
    for e in content:
        try:
            label = bytes(e.bytes).decode("utf-8")
        except UnicodeDecodeError:
            label = "bytes:" + "".join(f"\\x{b:02x}" for b in e.bytes)
        check(e.token == label, f"label of {e.bytes}: {e.token!r}")
        check(1 <= len(e.top_logprobs) <= 2 and e.top_logprobs[0].logprob == e.logprob,
              f"greedy {e.token!r} first of {e.top_logprobs}")
    chunks = list(client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                                 logprobs=True, stream=True))
    streamed = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    check(streamed == [e.logprob for e in content], f"streamed chat logprobs {streamed}")
    try:
        client.chat.completions.create(model=name, messages=messages, max_tokens=2, top_logprobs=2)
        check(False, "top_logprobs without logprobs was accepted")
    except openai.BadRequestError as e:
        check("top_logprobs" in str(e), str(e))

    # The conversation `archgen chat` has on the same turns (greedy).
    turn1 = [{"role": "user", "content": "hello"}]
    r1 = client.chat.completions.create(model=name, messages=turn1, max_tokens=6, temperature=0)
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "tell me more"}]
    r2 = client.chat.completions.create(model=name, messages=turn2, max_tokens=6, temperature=0)
    out["chat_turns"] = [r1.choices[0].message.content, r2.choices[0].message.content]

    check_tools(client, name, hf, messages)

    # Requests the server refuses: 400 with a message, and it keeps serving.
    try:
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "fox " * 50000}],
                                       max_tokens=4)
        check(False, "a prompt longer than the context was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "maximum context length" in str(e), str(e))
    try:
        client.completions.create(model=name, prompt=prompt, max_tokens=4, n=17)
        check(False, "n=17 was accepted")
    except openai.BadRequestError as e:
        check("n: 17 choices asked" in str(e) and e.param == "n", str(e))
    # n choices: greedy, so every choice is the one answer.
    several = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0, n=2)
    check([c.index for c in several.choices] == [0, 1], f"n=2: {several.choices}")
    check(all(c.text == text for c in several.choices), f"n=2 greedy: {several.choices}")
    # Embeddings: the client asks for base64 unless told otherwise and decodes
    # it; the values are the same as floats, and a list gives each input's
    # own embedding.
    texts = ["The quick brown fox", "Hello there"]
    by_default = client.embeddings.create(model=name, input=texts)
    as_float = client.embeddings.create(model=name, input=texts, encoding_format="float")
    alone = client.embeddings.create(model=name, input=texts[1], encoding_format="float")
    check(len(by_default.data) == 2 and [d.index for d in by_default.data] == [0, 1], str(by_default.data))
    check([d.embedding for d in by_default.data] == [d.embedding for d in as_float.data],
          "base64 and float embeddings differ")
    check(alone.data[0].embedding == as_float.data[1].embedding, "a list's embedding differs from its own")
    norm = sum(v * v for v in alone.data[0].embedding) ** 0.5
    check(abs(norm - 1) < 0.02, f"an L2-normalised embedding, norm {norm}")
    n_tokens = sum(len(tok.encode(t).ids) for t in texts)
    check(by_default.usage.prompt_tokens == n_tokens == by_default.usage.total_tokens, str(by_default.usage))
    try:
        client.embeddings.create(model=name, input="fox", dimensions=8)
        check(False, "dimensions=8 was accepted")
    except openai.BadRequestError as e:
        check(e.param == "dimensions" and "no truncation" in str(e), str(e))
    again = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0)
    check(again.choices[0].text == text, "the server still answers, the same")

    print(json.dumps(out))


if __name__ == "__main__":
    main()
