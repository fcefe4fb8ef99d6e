"""The official OpenAI Python SDK streams a turn with recall off (`x-perpetuity-recall: off`), its
question captured while the request is forwarded, and reads the answer's headers: the memory is
off and the question stored. It then asks the next turn with recall on. Environment: PROXY
(http://127.0.0.1:PORT). The Rust side checks that the first request was forwarded as the SDK
sent it and that the next turn's frame holds the first question."""

import os

import openai

client = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="sk-sdk-off", max_retries=0)
question = {"role": "user", "content": "The boat's mooring is at buoy 47, note it."}
raw = client.chat.completions.with_raw_response.create(
    model="gpt-4o",
    messages=[question],
    stream=True,
    extra_headers={"x-perpetuity-recall": "off"},
)
assert raw.headers.get("x-perpetuity-memory") == "off", dict(raw.headers)
assert raw.headers.get("x-perpetuity-captured") == "question", dict(raw.headers)
reply = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
assert reply, "the stream carried the reply"
following = client.chat.completions.create(
    model="gpt-4o",
    messages=[question, {"role": "assistant", "content": reply}, {"role": "user", "content": "Which buoy?"}],
)
assert following.choices[0].message.content == "Noted.", following
print("recall-off checks passed")
