"""The official `anthropic` client's tool use against a running `serve`.

Usage: python anthropic_client.py BASE_URL MODEL API_KEY
Exits non-zero with the failing check on stderr; prints one line per check.
"""

import json
import sys

import anthropic
import jsonschema

# Seeded requests for the forced call (the bar: 50 of 50).
SEEDED_REQUESTS = 50
# Room for a whole call in the demo model's small tokens.
CALL_MAX_TOKENS = 160

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}

TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
FORCED = {"type": "tool", "name": "get_weather"}

# A tool as published tools are written: no `additionalProperties`, no
# bounds on its strings (as openai_client.py's).
PUBLISHED_REQUESTS = 20
PUBLISHED_MAX_TOKENS = 200
PUBLISHED_WEATHER = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "City and country e.g. Bogota, Colombia"},
        "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["location"],
}
PUBLISHED_TOOLS = [{"name": "get_weather", "description": "The current weather", "input_schema": PUBLISHED_WEATHER}]
# What the server must hold a call to: the declared keys and no others.
PUBLISHED_WEATHER_CLOSED = dict(PUBLISHED_WEATHER, additionalProperties=False)

# A tool whose one string is unbounded, required, and nothing else (as
# openai_client.py's): the server closes the call before max_tokens.
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CITY_TOOLS = [{"name": "get_weather", "input_schema": CITY}]
CITY_CLOSED = dict(CITY, additionalProperties=False)


def main() -> None:
    base_url, model, api_key = sys.argv[1:4]
    client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]

    message = None
    for seed in range(SEEDED_REQUESTS):
        message = client.messages.create(
            model=model,
            max_tokens=CALL_MAX_TOKENS,
            messages=messages,
            tools=TOOLS,
            tool_choice=FORCED,
            extra_body={"seed": seed},
        )
        assert message.stop_reason == "tool_use", message
        (call,) = [block for block in message.content if block.type == "tool_use"]
        assert call.name == "get_weather" and call.id.startswith("toolu_"), call
        jsonschema.validate(call.input, WEATHER)
    print(f"messages.create tool_choice tool: {SEEDED_REQUESTS}/{SEEDED_REQUESTS} tool_use blocks valid")

    with client.messages.stream(
        model=model,
        max_tokens=CALL_MAX_TOKENS,
        messages=messages,
        tools=TOOLS,
        tool_choice={"type": "any"},
        extra_body={"seed": 3},
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use", final
    (streamed,) = [block for block in final.content if block.type == "tool_use"]
    jsonschema.validate(streamed.input, WEATHER)
    print(f"messages.stream tool_choice any: {json.dumps(streamed.input)}")

    # The call and its result, sent back.
    call = [block for block in message.content if block.type == "tool_use"][0]
    history = messages + [
        {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees"}]},
    ]
    answer = client.messages.create(model=model, max_tokens=16, messages=history, tools=TOOLS)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use"), answer
    print(f"tool_result turn: {answer.stop_reason}")

    published_tool_calls(client, model, messages)
    unbounded_string_calls(client, model, messages)


def published_tool_calls(client: anthropic.Anthropic, model: str, messages: list) -> None:
    """Forced calls of a tool without `additionalProperties` end where the
    declared keys do (the issue's bar: 20 of 20)."""
    for choice in (FORCED, {"type": "any"}):
        for seed in range(PUBLISHED_REQUESTS):
            message = client.messages.create(
                model=model,
                max_tokens=PUBLISHED_MAX_TOKENS,
                messages=messages,
                tools=PUBLISHED_TOOLS,
                tool_choice=choice,
                # The OpenAI checks' sampling: the same calls.
                extra_body={"seed": seed, "temperature": 1.0},
            )
            assert message.stop_reason == "tool_use", (choice, seed, message)
            (call,) = [block for block in message.content if block.type == "tool_use"]
            jsonschema.validate(call.input, PUBLISHED_WEATHER_CLOSED)
        print(f"published tool, tool_choice {choice['type']}: {PUBLISHED_REQUESTS}/{PUBLISHED_REQUESTS} tool_use blocks valid")


def unbounded_string_calls(client: anthropic.Anthropic, model: str, messages: list) -> None:
    """Forced tool uses whose only input is an unbounded string close before
    max_tokens (the issue's bar: 20 of 20)."""
    for choice in (FORCED, {"type": "any"}):
        for seed in range(PUBLISHED_REQUESTS):
            message = client.messages.create(
                model=model,
                max_tokens=PUBLISHED_MAX_TOKENS,
                messages=messages,
                tools=CITY_TOOLS,
                tool_choice=choice,
                extra_body={"seed": seed, "temperature": 1.0},
            )
            assert message.stop_reason == "tool_use", (choice, seed, message)
            (call,) = [block for block in message.content if block.type == "tool_use"]
            jsonschema.validate(call.input, CITY_CLOSED)
        print(f"unbounded string, tool_choice {choice['type']}: {PUBLISHED_REQUESTS}/{PUBLISHED_REQUESTS} tool_use blocks valid")


if __name__ == "__main__":
    main()
