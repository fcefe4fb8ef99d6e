"""One call of a Python agent library against the proxy (driven by tests/harness.rs).

openai-agents (its Runner over Responses), langchain-openai (Chat Completions),
langchain-anthropic (Messages) and litellm (Chat Completions and Messages), each running its own
tool loop with a `get_weather` tool whose schema's keys are not in alphabetical order.
Environment: BASE_URL (http://127.0.0.1:PORT), API_KEY, CLIENT (`openai-agents`,
`langchain-openai`, `langchain-anthropic`, `litellm-openai`, `litellm-anthropic`), PROMPT, IMAGE
(a base64 PNG sent with the prompt, optional). Prints `TOOL <arguments>` for each tool call it
ran and `REPLY <JSON string>` with the final text.
"""

import asyncio
import json
import os

BASE_URL = os.environ["BASE_URL"]
API_KEY = os.environ["API_KEY"]
PROMPT = os.environ["PROMPT"]
IMAGE = os.environ.get("IMAGE")
SYSTEM = "You are a terse assistant."
SCHEMA = {
    "type": "object",
    "properties": {
        "zone": {"type": "string", "description": "time zone"},
        "city": {"type": "string"},
        "days": {"type": "integer"},
    },
    "required": ["zone", "city"],
    "additionalProperties": False,
}
DESCRIPTION = "The weather in a city."
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": DESCRIPTION, "parameters": SCHEMA}}
DATA_URL = f"data:image/png;base64,{IMAGE}"


def run_tool(arguments):
    print(f"TOOL {arguments}", flush=True)
    return f"Sunny in {json.loads(arguments).get('city', 'the city')}"


def openai_agents():
    from agents import Agent, FunctionTool, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def invoke(_context, arguments):
        return run_tool(arguments)

    client = AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key=API_KEY, max_retries=0)
    tool = FunctionTool(
        name="get_weather",
        description=DESCRIPTION,
        params_json_schema=SCHEMA,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )
    agent = Agent(
        name="weather",
        instructions=SYSTEM,
        tools=[tool],
        model=OpenAIResponsesModel(model="gpt-5", openai_client=client),
    )
    content = [{"type": "input_text", "text": PROMPT}]
    if IMAGE:
        content.append({"type": "input_image", "image_url": DATA_URL, "detail": "auto"})

    async def run():
        result = Runner.run_streamed(agent, [{"role": "user", "content": content}])
        async for _event in result.stream_events():
            pass
        return result.final_output

    return asyncio.run(run())


def langchain_loop(model, image_part):
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

    content = [{"type": "text", "text": PROMPT}]
    if IMAGE:
        content.append(image_part)
    messages = [SystemMessage(SYSTEM), HumanMessage(content)]
    bound = model.bind_tools([CHAT_TOOL])
    while True:
        reply = bound.invoke(messages)
        messages.append(reply)
        if not reply.tool_calls:
            return reply.text if isinstance(reply.text, str) else reply.text()
        for call in reply.tool_calls:
            messages.append(ToolMessage(run_tool(json.dumps(call["args"])), tool_call_id=call["id"]))


def langchain_openai():
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model="gpt-4o", base_url=f"{BASE_URL}/v1", api_key=API_KEY, max_retries=0, streaming=True)
    return langchain_loop(model, {"type": "image_url", "image_url": {"url": DATA_URL}})


def langchain_anthropic():
    from langchain_anthropic import ChatAnthropic

    model = ChatAnthropic(model="claude-sonnet-4-5", base_url=BASE_URL, api_key=API_KEY, max_retries=0, max_tokens=1024)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE}}
    return langchain_loop(model, image)


def litellm_loop(model, api_base):
    import litellm

    content = [{"type": "text", "text": PROMPT}]
    if IMAGE:
        content.append({"type": "image_url", "image_url": {"url": DATA_URL}})
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]
    while True:
        reply = litellm.completion(
            model=model, api_base=api_base, api_key=API_KEY, messages=messages, tools=[CHAT_TOOL], max_tokens=1024
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function.arguments)})


CLIENTS = {
    "openai-agents": openai_agents,
    "langchain-openai": langchain_openai,
    "langchain-anthropic": langchain_anthropic,
    "litellm-openai": lambda: litellm_loop("openai/gpt-4o", f"{BASE_URL}/v1"),
    "litellm-anthropic": lambda: litellm_loop("anthropic/claude-sonnet-4-5", BASE_URL),
}

if __name__ == "__main__":
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    print(f"REPLY {json.dumps(CLIENTS[os.environ['CLIENT']]())}", flush=True)
