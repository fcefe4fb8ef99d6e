"""The official OpenAI Python SDK, an agent's tool result and a later question about it.
Environment: PROXY (http://127.0.0.1:PORT), STEP (`read`: a turn whose tool round returned a
long log; `ask`: a question about it in a new conversation, which the proxy's upstream answers
after a `memory_chain` round). The Rust side checks what each upstream round received."""

import os

import openai

client = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="sk-sdk-chain", max_retries=0, timeout=30)
if os.environ["STEP"] == "read":
    log = "".join(f"entry {i}: watered the tomato beds in the garden\n" for i in range(300))
    messages = [
        {"role": "user", "content": "Read my garden log and tell me what I watered."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_log", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "garden.log"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_log", "content": log},
    ]
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    reply = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
    expected = "You watered the tomato beds."
else:
    question = "What was the last entry of my garden log about the tomato beds?"
    reply = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": question}])
    expected = "Entry 299 was the last."
assert reply.choices[0].message.content == expected, reply
assert reply.choices[0].message.tool_calls is None, reply
print("tool chain step passed")
