"""pydantic-ai against the proxy (driven by tests/harness.rs): an Agent with instructions and a
`get_weather` tool, run once per prompt, each turn given the ones before as its
`message_history`, the last turn streamed. Environment: BASE_URL (http://127.0.0.1:PORT),
API_KEY, CLIENT (`chat`, `responses`, `anthropic`), PROMPTS (a JSON list). Prints
`TOOL <arguments>` for each tool call it ran and `REPLY <JSON string>` with the last text.
"""

import asyncio
import json
import os

from pydantic_ai import Agent

BASE_URL = os.environ["BASE_URL"]
API_KEY = os.environ["API_KEY"]


def model():
    client = os.environ["CLIENT"]
    if client == "anthropic":
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        return AnthropicModel("claude-sonnet-4-5", provider=AnthropicProvider(base_url=BASE_URL, api_key=API_KEY))
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=f"{BASE_URL}/v1", api_key=API_KEY)
    kind = OpenAIResponsesModel if client == "responses" else OpenAIChatModel
    return kind("gpt-4o", provider=provider)


agent = Agent(model(), instructions="You are a helpful assistant. Be brief.")


@agent.tool_plain
def get_weather(zone: str, city: str) -> str:
    """Get the weather for a city."""
    print(f"TOOL {json.dumps({'zone': zone, 'city': city})}", flush=True)
    return f"Sunny in {city}"


async def main():
    prompts = json.loads(os.environ["PROMPTS"])
    history = None
    for prompt in prompts[:-1]:
        result = await agent.run(prompt, message_history=history)
        history = result.all_messages()
    async with agent.run_stream(prompts[-1], message_history=history) as streamed:
        return await streamed.get_output()


print(f"REPLY {json.dumps(asyncio.run(main()))}", flush=True)
