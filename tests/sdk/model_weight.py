"""The official OpenAI Python SDK, one step of a two-conversation memory. Environment: PROXY
(http://127.0.0.1:PORT), STEP (`tell`: a fact, which the upstream's reply restates; `ask`: a
question about it in a new conversation). The Rust side checks which of the two stored turns
the question's frame shows when it has room for one."""

import os

import openai

client = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="sk-sdk-model", max_retries=0)
if os.environ["STEP"] == "tell":
    text = (
        "My sister's wedding is in Lisbon this May, and I still need a dress, a gift, a hotel, "
        "a car and a flight for two, and a week off work, and new shoes."
    )
    expected = "So your sister's wedding is in Lisbon in May."
else:
    text, expected = "When is my sister's wedding in Lisbon?", "Noted."
reply = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": text}])
assert reply.choices[0].message.content == expected, reply
print("model weight step passed")
