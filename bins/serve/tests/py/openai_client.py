"""The official `openai` client against a running `serve`.

Usage: python openai_client.py BASE_URL MODEL API_KEY
Exits non-zero with the failing check on stderr; prints one line per check.
"""

import json
import sys

import jsonschema
import openai

# Seeded requests per structured check (the bar: 50 of 50).
SEEDED_REQUESTS = 50
# Room for a whole call or object in the demo model's small tokens.
STRUCTURED_MAX_TOKENS = 160
# Room for a call whose strings are unbounded, as published tools leave
# them (the demo's context is 256 tokens).
PUBLISHED_MAX_TOKENS = 200

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "member"],
    "additionalProperties": False,
}

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}

TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER},
    }
]

# A tool as published tools are written: no `additionalProperties`, no
# bounds on its strings (OpenAI's own function-calling example).
PUBLISHED_REQUESTS = 20
PUBLISHED_WEATHER = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "City and country e.g. Bogota, Colombia"},
        "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["location"],
}
PUBLISHED_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The current weather", "parameters": PUBLISHED_WEATHER},
    }
]
# What the server must hold a call to: the declared keys and no others.
PUBLISHED_WEATHER_CLOSED = dict(PUBLISHED_WEATHER, additionalProperties=False)

# A tool whose one string is unbounded, required, and nothing else: the
# demo writes it until max_tokens unless the server closes the call there.
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CITY_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
CITY_CLOSED = dict(CITY, additionalProperties=False)


def main() -> None:
    base_url, model, api_key = sys.argv[1:4]
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)

    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [model], ids
    print(f"models.list: {ids}")

    messages = [{"role": "user", "content": "Give me a quote by Mark Twain."}]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=32, seed=3, temperature=0.7)
    text = reply.choices[0].message.content
    assert reply.object == "chat.completion", reply
    assert reply.choices[0].message.role == "assistant"
    assert text, reply
    assert reply.choices[0].finish_reason in ("stop", "length"), reply
    assert reply.usage.completion_tokens >= 1 and reply.usage.prompt_tokens >= 1, reply.usage
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    print(f"chat.completions.create: {text!r} ({reply.usage.completion_tokens} tokens)")

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=32,
        seed=3,
        temperature=0.7,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    streamed = "".join(pieces)
    assert streamed == text, (streamed, text)
    assert finish == reply.choices[0].finish_reason, finish
    assert usage is not None and usage.completion_tokens == reply.usage.completion_tokens, usage
    print(f"chat.completions.create(stream=True): {len(pieces)} chunks, same text, same seed")

    completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert completion.choices[0].text, completion
    print(f"completions.create: {completion.choices[0].text!r}")

    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
    except openai.NotFoundError as e:
        print(f"unknown model: {e.status_code}")
    else:
        raise AssertionError("an unknown model was accepted")

    try:
        client.chat.completions.create(model=model, messages=messages, temperature=7)
    except openai.BadRequestError as e:
        assert e.body and "temperature" in e.body.get("message", ""), e.body
        print(f"bad temperature: {e.status_code}")
    else:
        raise AssertionError("temperature 7 was accepted")

    structured_outputs(client, model)
    tool_calls(client, model)
    published_tool_calls(client, model)
    unbounded_string_calls(client, model)


def structured_outputs(client: openai.OpenAI, model: str) -> None:
    """A JSON-schema reply validates in every seeded request."""
    messages = [{"role": "user", "content": "Describe a person."}]
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in range(SEEDED_REQUESTS):
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=STRUCTURED_MAX_TOKENS,
            seed=seed,
            temperature=1.0,
            response_format=response_format,
        )
        content = reply.choices[0].message.content
        jsonschema.validate(json.loads(content), PERSON)
    print(f"response_format json_schema: {SEEDED_REQUESTS}/{SEEDED_REQUESTS} valid (jsonschema)")


def tool_calls(client: openai.OpenAI, model: str) -> None:
    """A forced call parses in every seeded request, streamed or not."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(SEEDED_REQUESTS):
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=STRUCTURED_MAX_TOKENS,
            seed=seed,
            temperature=1.0,
            tools=TOOLS,
            tool_choice=forced,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather", call
        assert call.id.startswith("call_"), call.id
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    print(f"tool_choice get_weather: {SEEDED_REQUESTS}/{SEEDED_REQUESTS} calls parse")

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=STRUCTURED_MAX_TOKENS,
        seed=3,
        temperature=1.0,
        tools=TOOLS,
        tool_choice="required",
        stream=True,
    )
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls", finish
    assert list(calls) == [0] and calls[0]["name"] == "get_weather", calls
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)
    print(f"tool_choice required, streamed: {calls[0]}")

    # The call and its result, sent back: the template renders both.
    history = messages + [
        {"role": "assistant", "content": None, "tool_calls": [reply.choices[0].message.tool_calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": reply.choices[0].message.tool_calls[0].id, "content": "18 degrees"},
    ]
    answer = client.chat.completions.create(model=model, messages=history, max_tokens=16, seed=1, tools=TOOLS)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls"), answer
    print("tool result turn: answered")


def published_tool_calls(client: openai.OpenAI, model: str) -> None:
    """Forced calls of tools without `additionalProperties` end where the
    declared keys do (the issue's bar: 20 of 20), as does a strict schema."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    choices = [("named", {"type": "function", "function": {"name": "get_weather"}}), ("required", "required")]
    for label, choice in choices:
        for seed in range(PUBLISHED_REQUESTS):
            reply = client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=PUBLISHED_MAX_TOKENS,
                seed=seed,
                temperature=1.0,
                tools=PUBLISHED_TOOLS,
                tool_choice=choice,
            )
            answer = reply.choices[0]
            assert answer.finish_reason == "tool_calls", (label, seed, answer)
            (call,) = answer.message.tool_calls
            assert call.function.name == "get_weather", (label, seed, call)
            jsonschema.validate(json.loads(call.function.arguments), PUBLISHED_WEATHER_CLOSED)
        print(f"published tools, tool_choice {label}: {PUBLISHED_REQUESTS}/{PUBLISHED_REQUESTS} calls parse")

    # A strict schema that leaves `additionalProperties` unsaid is closed too
    # (its strings bounded: no tool call's markup around it to end them).
    person_open = {key: value for key, value in PERSON.items() if key != "additionalProperties"}
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": person_open, "strict": True}}
    for seed in range(PUBLISHED_REQUESTS):
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Describe a person."}],
            max_tokens=PUBLISHED_MAX_TOKENS,
            seed=seed,
            temperature=1.0,
            response_format=response_format,
        )
        assert reply.choices[0].finish_reason == "stop", (seed, reply)
        jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
    print(f"json_schema strict, no additionalProperties: {PUBLISHED_REQUESTS}/{PUBLISHED_REQUESTS} valid")


def unbounded_string_calls(client: openai.OpenAI, model: str) -> None:
    """Forced calls whose only argument is an unbounded string close before
    max_tokens (the issue's bar: 20 of 20), named and required."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    choices = [("named", {"type": "function", "function": {"name": "get_weather"}}), ("required", "required")]
    for label, choice in choices:
        for seed in range(PUBLISHED_REQUESTS):
            reply = client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=PUBLISHED_MAX_TOKENS,
                seed=seed,
                temperature=1.0,
                tools=CITY_TOOLS,
                tool_choice=choice,
            )
            answer = reply.choices[0]
            assert answer.finish_reason == "tool_calls", (label, seed, answer)
            (call,) = answer.message.tool_calls
            assert call.function.name == "get_weather", (label, seed, call)
            jsonschema.validate(json.loads(call.function.arguments), CITY_CLOSED)
        print(f"unbounded string, tool_choice {label}: {PUBLISHED_REQUESTS}/{PUBLISHED_REQUESTS} calls parse")


if __name__ == "__main__":
    main()
