// One call of an official JavaScript client against the proxy (driven by tests/harness.rs):
// openai-node (Chat Completions, Responses) and the AI SDK (`ai` with @ai-sdk/openai and
// @ai-sdk/anthropic), each running its own tool loop with a `get_weather` tool whose schema's
// keys are not in alphabetical order. Environment: HARNESS_NPM (the npm prefix holding the
// clients), BASE_URL (http://127.0.0.1:PORT), API_KEY, CLIENT (`openai-chat`,
// `openai-responses`, `ai-openai`, `ai-anthropic`), PROMPT, IMAGE (a base64 PNG sent with the
// prompt, optional). Prints `TOOL <arguments>` for each tool call it ran and `REPLY <JSON
// string>` with the final text.
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const require = createRequire(`${process.env.HARNESS_NPM}/node_modules/`);
const load = (name) => import(pathToFileURL(require.resolve(name)).href);
const { BASE_URL, API_KEY, CLIENT, PROMPT, IMAGE } = process.env;

const SCHEMA = {
  type: "object",
  properties: {
    zone: { type: "string", description: "time zone" },
    city: { type: "string" },
    days: { type: "integer" },
  },
  required: ["zone", "city"],
  additionalProperties: false,
};
const DESCRIPTION = "The weather in a city.";

function runTool(args) {
  console.log(`TOOL ${args}`);
  return `Sunny in ${JSON.parse(args).city ?? "the city"}`;
}

async function openaiChat() {
  const { default: OpenAI } = await load("openai");
  const client = new OpenAI({ baseURL: `${BASE_URL}/v1`, apiKey: API_KEY, maxRetries: 0 });
  const content = IMAGE
    ? [
        { type: "text", text: PROMPT },
        { type: "image_url", image_url: { url: `data:image/png;base64,${IMAGE}` } },
      ]
    : PROMPT;
  const messages = [
    { role: "system", content: "You are a terse assistant." },
    { role: "user", content },
  ];
  const tools = [{ type: "function", function: { name: "get_weather", description: DESCRIPTION, parameters: SCHEMA } }];
  for (;;) {
    const stream = await client.chat.completions.create({ model: "gpt-4o", messages, tools, stream: true });
    let text = "";
    const calls = [];
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta;
      if (!delta) continue;
      text += delta.content ?? "";
      for (const call of delta.tool_calls ?? []) {
        calls[call.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } };
        const into = calls[call.index];
        into.id += call.id ?? "";
        into.function.name += call.function?.name ?? "";
        into.function.arguments += call.function?.arguments ?? "";
      }
    }
    if (calls.length === 0) return text;
    messages.push({ role: "assistant", content: text || null, tool_calls: calls });
    for (const call of calls) {
      messages.push({ role: "tool", tool_call_id: call.id, content: runTool(call.function.arguments) });
    }
  }
}

async function openaiResponses() {
  const { default: OpenAI } = await load("openai");
  const client = new OpenAI({ baseURL: `${BASE_URL}/v1`, apiKey: API_KEY, maxRetries: 0 });
  const content = [{ type: "input_text", text: PROMPT }];
  if (IMAGE) content.push({ type: "input_image", image_url: `data:image/png;base64,${IMAGE}`, detail: "auto" });
  const input = [{ role: "user", content }];
  const tools = [{ type: "function", name: "get_weather", description: DESCRIPTION, parameters: SCHEMA, strict: true }];
  for (;;) {
    const stream = await client.responses.create({
      model: "gpt-5",
      instructions: "You are a terse assistant.",
      input,
      tools,
      store: false,
      stream: true,
    });
    let response;
    for await (const event of stream) {
      if (event.type === "response.completed") response = event.response;
    }
    const calls = response.output.filter((item) => item.type === "function_call");
    if (calls.length === 0) return response.output_text ?? outputText(response);
    input.push(...response.output);
    for (const call of calls) {
      input.push({ type: "function_call_output", call_id: call.call_id, output: runTool(call.arguments) });
    }
  }
}

function outputText(response) {
  return response.output
    .filter((item) => item.type === "message")
    .flatMap((item) => item.content.map((part) => part.text ?? ""))
    .join("");
}

async function aiSdk(provider) {
  const { streamText, tool, jsonSchema, stepCountIs } = await load("ai");
  const model =
    provider === "openai"
      ? (await load("@ai-sdk/openai")).createOpenAI({ baseURL: `${BASE_URL}/v1`, apiKey: API_KEY })("gpt-5")
      : (await load("@ai-sdk/anthropic")).createAnthropic({ baseURL: `${BASE_URL}/v1`, apiKey: API_KEY })(
          "claude-sonnet-4-5",
        );
  const content = [{ type: "text", text: PROMPT }];
  if (IMAGE) content.push({ type: "file", data: Buffer.from(IMAGE, "base64"), mediaType: "image/png" });
  const result = streamText({
    model,
    system: "You are a terse assistant.",
    messages: [{ role: "user", content }],
    tools: {
      get_weather: tool({
        description: DESCRIPTION,
        inputSchema: jsonSchema(SCHEMA),
        execute: async (input) => runTool(JSON.stringify(input)),
      }),
    },
    stopWhen: stepCountIs(4),
    maxRetries: 0,
  });
  return await result.text;
}

const clients = {
  "openai-chat": openaiChat,
  "openai-responses": openaiResponses,
  "ai-openai": () => aiSdk("openai"),
  "ai-anthropic": () => aiSdk("anthropic"),
};
console.log(`REPLY ${JSON.stringify(await clients[CLIENT]())}`);
