"""The official `openai` client against a running `serve`.

Usage: python openai_client.py BASE_URL MODEL API_KEY
Exits non-zero with the failing check on stderr; prints one line per check.
"""

import sys

import openai


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


if __name__ == "__main__":
    main()
