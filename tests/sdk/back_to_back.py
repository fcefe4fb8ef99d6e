"""The official OpenAI Python SDK streams a long reply to its end, then sends the next turn at
once, its history resent as a harness does. Environment: PROXY (http://127.0.0.1:PORT). The Rust
side checks that the next turn's frame holds the reply's end: a reply read whole is stored."""

import os

import openai

client = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="sk-sdk-next", max_retries=0)
question = {"role": "user", "content": "Write out my whole packing list, then the lock code."}
stream = client.chat.completions.create(model="gpt-4o", messages=[question], stream=True)
reply = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
assert reply.endswith("The lock code is 3391."), reply[-200:]
following = client.chat.completions.create(
    model="gpt-4o",
    messages=[question, {"role": "assistant", "content": reply}, {"role": "user", "content": "And the code?"}],
)
assert following.choices[0].message.content == "Noted.", following
print("back-to-back checks passed")
