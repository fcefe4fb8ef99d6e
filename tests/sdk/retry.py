"""The official OpenAI Python SDK retrying a 429 through the proxy on its own (its default
max_retries): the call succeeds after one retry. Environment: PROXY (http://127.0.0.1:PORT).
The Rust side checks that the retried question was stored once."""

import os

import openai

client = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="sk-sdk-retry", max_retries=2)
reply = client.chat.completions.create(
    model="gpt-4o",
    messages=[{"role": "user", "content": "My bike lock code is 3391, remember it."}],
)
assert reply.choices[0].message.content == "Noted.", reply
print("retry checks passed")
