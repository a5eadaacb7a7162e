"""Drives `archgen serve` with the official openai client the way
frameworks built on it do: an API key, `models.retrieve`, requests with
extra and null fields, `stream_options`, the sampling fields with the seed
that replays them, structured output, `n`, a forced function call,
log-probabilities, embeddings, and the errors a framework reads
(status, `param`, `code`). Asserts as it goes (a failed check exits non-zero
with its message) and prints what it saw as JSON.

usage: openai_framework_client.py BASE_URL API_KEY MODEL_ID
  BASE_URL  e.g. http://127.0.0.1:40123/v1
  API_KEY   the key the server was started with (--api-key)
  MODEL_ID  the id the server serves (its model directory's name)
"""

import json
import sys

import openai


def check(cond, what):
    if not cond:
        raise SystemExit(f"check failed: {what}")


def main() -> None:
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    # No retries: every answer below is the server's first.
    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0)

    # The key: a wrong one is a 401 the client raises as AuthenticationError.
    try:
        openai.OpenAI(base_url=base, api_key="not-the-key", max_retries=0).models.list()
        raise SystemExit("check failed: a wrong key was served")
    except openai.AuthenticationError as e:
        check(e.status_code == 401 and e.code == "invalid_api_key", f"401 body: {e.body}")

    # Models: the list, the served id, and another id (404).
    check([m.id for m in client.models.list().data] == [model], "models.list")
    retrieved = client.models.retrieve(model)
    check(retrieved.id == model and retrieved.object == "model", f"models.retrieve: {retrieved}")
    try:
        client.models.retrieve("gpt-4o")
        raise SystemExit("check failed: another model id was found")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.code == "model_not_found", f"404 body: {e.body}")

    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello"}]
    # What frameworks send beside the served fields: values without effect,
    # defaults, and fields of their own (extra_body). Only the unknown ones
    # are named back.
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        max_tokens=4,
        temperature=0,
        n=1,
        user="user-1",
        metadata={"run": "ci"},
        store=False,
        response_format={"type": "text"},
        presence_penalty=0,
        extra_body={"frobnicate": True, "top_k": None, "chat_template_kwargs": {"x": 1}},
    )
    check(raw.headers.get("x-archgen-ignored-fields") == "frobnicate",
          f"ignored header: {raw.headers.get('x-archgen-ignored-fields')}")
    whole = raw.parse()
    check(whole.choices[0].message.role == "assistant" and whole.usage.completion_tokens <= 4, str(whole))

    # Streamed with usage, and the same text.
    chunks = list(client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True}, parallel_tool_calls=None))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == whole.choices[0].message.content, f"stream {streamed!r} vs {whole.choices[0].message.content!r}")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens,
          f"usage chunk: {chunks[-1]}")

    # The sampling fields are served: the seed a request used comes back in
    # x-archgen-seed, and sending it as `seed` replays the answer.
    sampling = dict(model=model, messages=messages, max_tokens=4, temperature=1.0,
                    logit_bias={"5": 3}, presence_penalty=0.5,
                    extra_body={"top_k": 20, "min_p": 0.05})
    sampled = client.chat.completions.with_raw_response.create(**sampling)
    seed = sampled.headers.get("x-archgen-seed")
    check(seed is not None and seed.isdigit(), f"seed header: {sampled.headers}")
    first = sampled.parse().choices[0].message.content
    replayed = client.chat.completions.create(seed=int(seed), **sampling).choices[0].message.content
    check(replayed == first, f"seed {seed} replayed {replayed!r}, first {first!r}")

    # Structured output as frameworks ask for it: a JSON schema (strict), the
    # answer parsed and checked against it.
    schema = {"type": "object", "properties": {"mood": {"enum": ["calm", "busy"]},
                                               "level": {"type": "integer", "minimum": 1, "maximum": 5}},
              "required": ["mood", "level"], "additionalProperties": False}
    structured = client.chat.completions.create(
        model=model, messages=messages, max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "state", "schema": schema, "strict": True}})
    check(structured.choices[0].finish_reason == "stop", str(structured))
    answer = json.loads(structured.choices[0].message.content)
    check(set(answer) == {"mood", "level"} and answer["mood"] in ("calm", "busy")
          and isinstance(answer["level"], int) and 1 <= answer["level"] <= 5, str(answer))

    # Function calling as agent frameworks drive it: a named function forced,
    # the call read back from tool_calls with JSON arguments.
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string", "maxLength": 8}},
                                                   "required": ["city"]}}}]
    forced = client.chat.completions.create(
        model=model, messages=messages, max_tokens=160, seed=5, tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False)
    calls = forced.choices[0].message.tool_calls or []
    check(forced.choices[0].finish_reason == "tool_calls" and len(calls) == 1
          and calls[0].function.name == "get_weather", str(forced))
    check(isinstance(json.loads(calls[0].function.arguments).get("city"), str), str(calls[0]))

    # Log-probabilities as evaluation harnesses ask for them.
    scored = client.chat.completions.create(model=model, messages=messages, max_tokens=3, temperature=0,
                                            logprobs=True, top_logprobs=2)
    entries = scored.choices[0].logprobs.content
    check(len(entries) == scored.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in entries),
          str(scored.choices[0].logprobs))

    # Embeddings as retrieval frameworks call them: a list of texts, the
    # client's default base64 encoding, one vector per text in order.
    texts = ["first document", "second document", "a query"]
    embedded = client.embeddings.create(model=model, input=texts)
    check([d.index for d in embedded.data] == [0, 1, 2], str(embedded.data))
    check(len({len(d.embedding) for d in embedded.data}) == 1, "embeddings of different sizes")
    alone = client.embeddings.create(model=model, input=texts[2], encoding_format="float")
    check(alone.data[0].embedding == embedded.data[2].embedding, "a text's embedding depends on its batch")

    # What the server does not serve, or a value out of a field's range, is a
    # 400 naming the field.
    refused = {}
    # n choices: each its own sequence, choice i seeded with seed + i.
    several = client.chat.completions.create(n=2, seed=int(seed), **sampling)
    check([c.index for c in several.choices] == [0, 1], f"n=2 choices: {several.choices}")
    check(several.choices[0].message.content == first, "choice 0 of n=2 is not the n=1 answer")
    for field, value in [("modalities", ["text", "audio"]), ("n", 17), ("logit_bias", {"5": 101})]:
        try:
            client.chat.completions.create(model=model, messages=messages, max_tokens=2, **{field: value})
            raise SystemExit(f"check failed: {field}={value} was served")
        except openai.BadRequestError as e:
            check(e.param == field, f"{field}: param {e.param} in {e.body}")
            refused[field] = e.message
    try:
        client.completions.create(model=model, prompt="Hi", extra_body={"max_tokens": "ten"})
        raise SystemExit("check failed: max_tokens 'ten' was served")
    except openai.BadRequestError as e:
        check(e.param == "max_tokens", f"param {e.param} in {e.body}")
        check("max_tokens: expected an unsigned integer, got a string" in e.message, e.message)

    print(json.dumps({"text": whole.choices[0].message.content, "refused": refused}))


if __name__ == "__main__":
    main()
