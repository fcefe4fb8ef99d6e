"""The official openai and anthropic SDKs against the proxy (driven by tests/sdk.rs).

The proxy's upstream replays recorded provider answers in the order the calls below are made;
each call checks what the SDK made of the answer against the recording itself. Any failed check
raises, and the exit status says so. Environment: PROXY (http://127.0.0.1:PORT), FIXTURES (the
providers' fixture folder).
"""

import json
import os
import sys

import anthropic
import openai

PROXY = os.environ["PROXY"]
FIXTURES = os.environ["FIXTURES"]


def fixture(path):
    with open(os.path.join(FIXTURES, path), "rb") as f:
        return f.read()


def sse_data(path):
    """Every JSON `data:` payload of a recorded stream."""
    out = []
    for line in fixture(path).decode("utf-8").splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload != "[DONE]":
                out.append(json.loads(payload))
    return out


def check(label, got, expected):
    if got != expected:
        raise AssertionError(f"{label}: got {got!r}, expected {expected!r}")
    print(f"ok {label}")


def raises(label, kind, call):
    try:
        call()
    except kind as err:
        print(f"ok {label}: {type(err).__name__} {getattr(err, 'status_code', '')}")
        return
    raise AssertionError(f"{label}: no {kind.__name__} raised")


def openai_calls():
    client = openai.OpenAI(base_url=f"{PROXY}/v1", api_key="sk-sdk", max_retries=0, timeout=30)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Invent a holiday."}]

    whole = json.loads(fixture("openai-chat/vercel_text.response.json"))
    reply = client.chat.completions.create(model="gpt-4.1-nano", messages=messages)
    check("openai non-stream id", reply.id, whole["id"])
    check("openai non-stream text", reply.choices[0].message.content, whole["choices"][0]["message"]["content"])
    check("openai non-stream usage", reply.usage.total_tokens, whole["usage"]["total_tokens"])

    chunks = sse_data("openai-chat/oai-py_text_usage.sse")
    expected = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    raw = client.chat.completions.create(model="gpt-4o", messages=messages, stream=True)
    check("openai stream raw text", "".join(c.choices[0].delta.content or "" for c in raw if c.choices), expected)

    with client.chat.completions.stream(model="gpt-4o", messages=messages) as stream:
        final = stream.get_final_completion()
    check("openai stream helper text", final.choices[0].message.content, expected)

    tools = [{"type": "function", "function": {"name": "get_stock_price", "parameters": {"type": "object", "properties": {"ticker": {"type": "string"}}}}}]
    with client.chat.completions.stream(model="gpt-4o", messages=messages, tools=tools) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    recorded = [
        call["function"]["name"]
        for chunk in sse_data("openai-chat/oai-py_tool_calls_parallel_usage.sse")
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls") or []
        if call.get("function", {}).get("name")
    ]
    check("openai parallel tool calls", [c.function.name for c in calls], recorded)
    check("openai two parallel calls", len(calls), 2)
    for call in calls:
        json.loads(call.function.arguments)

    ask = lambda: client.chat.completions.create(model="gpt-4o", messages=messages)
    raises("openai 401", openai.AuthenticationError, ask)
    raises("openai 429", openai.RateLimitError, ask)
    raises("openai 500", openai.InternalServerError, ask)


def responses_calls():
    client = openai.OpenAI(base_url=f"{PROXY}/v1", api_key="sk-sdk", max_retries=0, timeout=30)
    recorded = [json.loads(line) for line in fixture("openai-responses/vercel_text_two_messages.jsonl").decode("utf-8").splitlines() if line.strip()]
    expected = "".join(e["delta"] for e in recorded if e["type"] == "response.output_text.delta")

    raw = client.responses.create(model="gpt-5.3-codex", instructions="Be brief.", input="Suggest names.", stream=True)
    check("responses stream raw text", "".join(e.delta for e in raw if e.type == "response.output_text.delta"), expected)

    with client.responses.stream(model="gpt-5.3-codex", instructions="Be brief.", input="Suggest names.") as stream:
        final = stream.get_final_response()
    check("responses stream helper id", final.id, recorded[0]["response"]["id"])
    check("responses stream helper status", final.status, "completed")


def anthropic_calls():
    client = anthropic.Anthropic(base_url=PROXY, api_key="ak-sdk", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "How are you?"}]

    whole = json.loads(fixture("anthropic-messages/vercel_text.response.json"))
    reply = client.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=messages)
    check("anthropic non-stream id", reply.id, whole["id"])
    check("anthropic non-stream text", reply.content[0].text, whole["content"][0]["text"])

    with client.messages.stream(model="claude-haiku-4-5", max_tokens=64, messages=messages) as stream:
        final = stream.get_final_message()
    check("anthropic stream helper text", final.content[0].text, "Hello there!")
    check("anthropic stream stop", final.stop_reason, "end_turn")

    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}}}]
    with client.messages.stream(model="claude-haiku-4-5", max_tokens=64, messages=messages, tools=tools) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    check("anthropic tool use", [u.name for u in uses], ["get_weather"])
    check("anthropic tool input is an object", isinstance(uses[0].input, dict), True)

    ask = lambda: client.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=messages)
    raises("anthropic 429", anthropic.RateLimitError, ask)
    raises("anthropic 401", anthropic.AuthenticationError, ask)


if __name__ == "__main__":
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}")
    openai_calls()
    responses_calls()
    anthropic_calls()
    print("all SDK checks passed")
    sys.exit(0)
