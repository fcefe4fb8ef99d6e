"""The official openai, anthropic and google-genai SDKs against the proxy (driven by tests/sdk.rs).

The proxy's upstream replays recorded provider answers in the order the calls below are made;
each call checks what the SDK made of the answer against the recording itself. Any failed check
raises, and the exit status says so. Environment: PROXY (http://127.0.0.1:PORT), FIXTURES (the
providers' fixture folder), SDKS (which of `openai`, `responses`, `anthropic`, `gemini` to
call, comma-separated; all when absent).
"""

import json
import os
import sys

import anthropic
import openai
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

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

    def cut_short():
        for _ in client.chat.completions.create(model="gpt-4o", messages=messages, stream=True):
            pass

    raises("openai mid-stream error", openai.APIError, cut_short)


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

    failing = lambda: list(client.responses.create(model="gpt-5.3-codex", instructions="Be brief.", input="Suggest names.", stream=True))
    raises("responses mid-stream error", openai.APIError, failing)


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
    raises("anthropic 529", anthropic.OverloadedError, ask)

    def cut_short():
        with client.messages.stream(model="claude-haiku-4-5", max_tokens=64, messages=messages, extra_headers={"anthropic-beta": "scripted-beta-1"}) as stream:
            stream.get_final_message()

    raises("anthropic mid-stream error", anthropic.APIStatusError, cut_short)


def jsonl(path):
    return [json.loads(line) for line in fixture(path).decode("utf-8").splitlines() if line.strip()]


def gemini_calls():
    client = genai.Client(
        api_key="g-sdk",
        http_options=genai_types.HttpOptions(
            base_url=PROXY,
            timeout=30_000,
            retry_options=genai_types.HttpRetryOptions(attempts=1),
        ),
    )
    config = genai_types.GenerateContentConfig(system_instruction="Be brief.")

    whole = json.loads(fixture("gemini/vercel_text.response.json"))
    reply = client.models.generate_content(model="gemini-3-pro-preview", contents="How many r's in strawberry?", config=config)
    check("gemini non-stream id", reply.response_id, whole["responseId"])
    check("gemini non-stream text", reply.text, whole["candidates"][0]["content"]["parts"][0]["text"])
    check("gemini non-stream usage", reply.usage_metadata.total_token_count, whole["usageMetadata"]["totalTokenCount"])

    recorded = jsonl("gemini/vercel_text.jsonl")
    expected = "".join(p.get("text", "") for c in recorded for p in c["candidates"][0]["content"]["parts"])
    chunks = list(client.models.generate_content_stream(model="gemini-3-pro-preview", contents="How many r's in strawberry?", config=config))
    check("gemini stream chunks", len(chunks), len(recorded))
    check("gemini stream text", "".join(c.text or "" for c in chunks), expected)
    check("gemini stream finish", chunks[-1].candidates[0].finish_reason, genai_types.FinishReason.STOP)

    weather = genai_types.Tool(function_declarations=[genai_types.FunctionDeclaration(
        name="weather",
        description="The weather in a place",
        parameters=genai_types.Schema(type="OBJECT", properties={"location": genai_types.Schema(type="STRING")}),
    )])
    tooled = genai_types.GenerateContentConfig(
        system_instruction="Be brief.",
        tools=[weather],
        automatic_function_calling=genai_types.AutomaticFunctionCallingConfig(disable=True),
    )
    recorded = jsonl("gemini/vercel_function_call.jsonl")
    expected = [p["functionCall"] for c in recorded for p in c["candidates"][0]["content"]["parts"] if "functionCall" in p]
    chunks = list(client.models.generate_content_stream(model="gemini-3-pro-preview", contents="Weather in San Francisco?", config=tooled))
    calls = [call for c in chunks for call in (c.function_calls or [])]
    check("gemini function call names", [c.name for c in calls], [e["name"] for e in expected])
    check("gemini function call args", [c.args for c in calls], [e["args"] for e in expected])

    ask = lambda: client.models.generate_content(model="gemini-3-pro-preview", contents="Again?", config=config)
    raises("gemini 429", genai_errors.ClientError, ask)
    raises("gemini 500", genai_errors.ServerError, ask)


if __name__ == "__main__":
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, google-genai {genai.__version__}")
    calls = {"openai": openai_calls, "responses": responses_calls, "anthropic": anthropic_calls, "gemini": gemini_calls}
    for name in os.environ.get("SDKS", ",".join(calls)).split(","):
        calls[name]()
    print("all SDK checks passed")
    sys.exit(0)
