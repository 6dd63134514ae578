"""The official `openai` and `anthropic` clients read a thinking model's
reasoning apart from its answer, streamed and not.

Usage: python thinking_client.py BASE_URL MODEL API_KEY
The server runs the demo model with thinking_template.jinja, whose
generation prompt opens `<think>` unless `enable_thinking` is false (as
Qwen3.5's does). The demo never closes its thinking itself: what it writes
is reasoning until a budget ends it.
Exits non-zero with the failing check on stderr; prints one line per check.
"""

import sys

import anthropic
import openai

QUESTION = [{"role": "user", "content": "Tell me a fortune."}]
BUDGET_TOKENS = 6
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}},
    "required": ["city"],
}


def main() -> None:
    base_url, model, api_key = sys.argv[1:4]
    openai_checks(openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=60), model)
    anthropic_checks(anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=60), model)


def openai_checks(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, seed=1)
    message = reply.choices[0].message
    reasoning = message.model_extra.get("reasoning_content")
    assert reasoning, message
    assert not message.content and "<think>" not in reasoning, message
    print(f"reasoning_content: {reasoning!r}")

    stream = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, seed=1, stream=True)
    reasoning_pieces, content_pieces = [], []
    for chunk in stream:
        for choice in chunk.choices:
            reasoning_pieces.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            content_pieces.append(choice.delta.content or "")
    assert "".join(reasoning_pieces).rstrip() == reasoning, (reasoning_pieces, reasoning)
    assert not "".join(content_pieces), content_pieces
    print(f"streamed reasoning_content: {len([p for p in reasoning_pieces if p])} deltas, the same text")

    off = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        max_tokens=16,
        seed=1,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert off.choices[0].message.content, off
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {}), off
    print(f"enable_thinking false: content {off.choices[0].message.content!r}, no reasoning")

    # An earlier reply's reasoning, sent back, is the template's to show or drop.
    history = QUESTION + [
        {"role": "assistant", "content": "A fortune.", "reasoning_content": reasoning},
        {"role": "user", "content": "Another."},
    ]
    again = client.chat.completions.create(model=model, messages=history, max_tokens=4, seed=1)
    assert again.choices[0].finish_reason == "length", again
    print("reasoning_content sent back: accepted")

    try:
        client.chat.completions.create(
            model=model, messages=QUESTION, extra_body={"chat_template_kwargs": {"messages": []}}
        )
    except openai.BadRequestError as e:
        assert e.body and e.body.get("param") == "chat_template_kwargs", e.body
        print("chat_template_kwargs naming a server variable: 400")
    else:
        raise AssertionError("chat_template_kwargs could replace the messages")


def anthropic_checks(client: anthropic.Anthropic, model: str) -> None:
    thinking = {"type": "enabled", "budget_tokens": BUDGET_TOKENS}
    message = client.messages.create(
        model=model, max_tokens=40, messages=QUESTION, thinking=thinking, extra_body={"seed": 1}
    )
    kinds = [block.type for block in message.content]
    assert kinds == ["thinking", "text"], message
    assert message.content[0].thinking and message.content[1].text, message
    assert "</think>" not in message.content[1].text, message
    print(f"thinking block {message.content[0].thinking!r}, then text {message.content[1].text!r}")

    with client.messages.stream(
        model=model, max_tokens=40, messages=QUESTION, thinking=thinking, extra_body={"seed": 1}
    ) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == kinds, final
    assert final.content[0].thinking.rstrip() == message.content[0].thinking, final
    assert final.content[1].text == message.content[1].text, final
    print("streamed: the same thinking and text blocks")

    off = client.messages.create(
        model=model, max_tokens=16, messages=QUESTION, thinking={"type": "disabled"}, extra_body={"seed": 1}
    )
    assert [block.type for block in off.content] == ["text"], off
    print("thinking disabled: text only")

    # A call after the thinking: the budget ends it, the grammar holds the answer.
    tools = [{"name": "get_weather", "description": "The weather", "input_schema": WEATHER}]
    called = client.messages.create(
        model=model,
        max_tokens=80,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        thinking=thinking,
        tools=tools,
        tool_choice={"type": "any"},
        extra_body={"seed": 2},
    )
    assert [block.type for block in called.content] == ["thinking", "tool_use"], called
    assert called.stop_reason == "tool_use" and set(called.content[1].input) <= {"city"}, called
    print(f"tool_use after thinking: {called.content[1].input}")

    history = QUESTION + [
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {"role": "user", "content": "Another."},
    ]
    again = client.messages.create(model=model, max_tokens=4, messages=history, extra_body={"seed": 1})
    assert again.stop_reason == "max_tokens", again
    print("thinking block sent back: accepted")

    try:
        client.messages.create(
            model=model, max_tokens=8, messages=QUESTION, thinking={"type": "enabled", "budget_tokens": 8}
        )
    except anthropic.BadRequestError as e:
        print(f"budget_tokens not below max_tokens: {e.status_code}")
    else:
        raise AssertionError("a budget that leaves no room for the answer was accepted")


if __name__ == "__main__":
    main()
