"""The official SDKs' stream helpers across memory tool rounds (driven by tests/tools.rs).

The proxy's upstream first calls a memory tool and then answers with a recording, or mixes a
memory call with one of the harness's own; the helpers must see one valid message each time
(they raise on index gaps and on a second message start). Environment: PROXY, FIXTURES.
"""

import json
import os

import anthropic
import openai

PROXY = os.environ["PROXY"]
FIXTURES = os.environ["FIXTURES"]

# The usage tests/tools.rs scripts for each round that calls a memory tool.
CHAT_ROUND_TOKENS = 107
RESPONSES_ROUND_TOKENS = 69
ANTHROPIC_ROUND_OUTPUT = 20


def fixture_events(path):
    """Every JSON `data:` payload of a recorded stream."""
    with open(os.path.join(FIXTURES, path), "rb") as f:
        lines = f.read().decode("utf-8").splitlines()
    return [json.loads(l[5:].strip()) for l in lines if l.startswith("data:") and l[5:].strip() != "[DONE]"]


def check(label, got, expected):
    if got != expected:
        raise AssertionError(f"{label}: got {got!r}, expected {expected!r}")
    print(f"ok {label}")


def openai_rounds():
    client = openai.OpenAI(base_url=f"{PROXY}/v1", api_key="sk-sdk-tools", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "What did we decide about the trip?"}]
    tools = [{"type": "function", "function": {"name": "get_stock_price", "parameters": {"type": "object"}}}]
    recorded = fixture_events("openai-chat/oai-py_text_usage.sse")
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in recorded if c["choices"])
    usage = [c for c in recorded if c.get("usage")][-1]["usage"]

    with client.chat.completions.stream(
        model="gpt-4o", messages=messages, tools=tools, stream_options={"include_usage": True}
    ) as stream:
        final = stream.get_final_completion()
    check("openai helper text after a memory round", final.choices[0].message.content, text)
    check("openai helper finish", final.choices[0].finish_reason, "stop")
    check("openai helper no tool calls", final.choices[0].message.tool_calls, None)
    check("openai helper usage summed", final.usage.total_tokens, usage["total_tokens"] + CHAT_ROUND_TOKENS)

    with client.chat.completions.stream(model="gpt-4o", messages=messages, tools=tools) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    check("openai helper mixed: the harness call alone", [c.function.name for c in calls], ["get_stock_price"])
    check("openai helper mixed: arguments", json.loads(calls[0].function.arguments), {"ticker": "AAPL"})
    check("openai helper mixed: finish", final.choices[0].finish_reason, "tool_calls")


def responses_rounds():
    client = openai.OpenAI(base_url=f"{PROXY}/v1", api_key="sk-sdk-tools", max_retries=0, timeout=30)
    with open(os.path.join(FIXTURES, "openai-responses/vercel_text_two_messages.jsonl"), encoding="utf-8") as f:
        done = [json.loads(l) for l in f if l.strip()][-1]["response"]
    text = "".join(
        part["text"] for item in done["output"] if item["type"] == "message" for part in item["content"]
    )
    with client.responses.stream(model="gpt-5.3-codex", instructions="Be brief.", input="Suggest names.") as stream:
        final = stream.get_final_response()
    check("responses helper: the first round's id", final.id, "resp_first")
    check("responses helper text after a memory round", final.output_text, text)
    check("responses helper usage summed", final.usage.total_tokens, done["usage"]["total_tokens"] + RESPONSES_ROUND_TOKENS)


def anthropic_rounds():
    client = anthropic.Anthropic(base_url=PROXY, api_key="sk-ant-sdk-tools", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "Which hobby came up most?"}]
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}]
    recorded = fixture_events("anthropic-messages/ant-py_text_basic.sse")
    output = [e for e in recorded if e["type"] == "message_delta"][-1]["usage"]["output_tokens"]

    with client.messages.stream(model="claude-haiku-4-5", max_tokens=64, messages=messages, tools=tools) as stream:
        final = stream.get_final_message()
    check("anthropic helper blocks", [b.type for b in final.content], ["text", "text"])
    check("anthropic helper text", [b.text for b in final.content], ["Let me look.", "Hello there!"])
    check("anthropic helper stop", final.stop_reason, "end_turn")
    check("anthropic helper usage summed", final.usage.output_tokens, output + ANTHROPIC_ROUND_OUTPUT)

    with client.messages.stream(model="claude-haiku-4-5", max_tokens=64, messages=messages, tools=tools) as stream:
        final = stream.get_final_message()
    check("anthropic helper mixed: blocks", [b.type for b in final.content], ["text", "tool_use"])
    check("anthropic helper mixed: the harness call", final.content[1].name, "get_weather")
    check("anthropic helper mixed: input", final.content[1].input, {"city": "Paris"})
    check("anthropic helper mixed: stop", final.stop_reason, "tool_use")


openai_rounds()
responses_rounds()
anthropic_rounds()
print("all tool round checks passed")
