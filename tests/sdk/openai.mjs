// Drives the official OpenAI Node client against baseURL: Chat Completions
// and Responses, JSON and streaming, each case with its own X-Test-Key
// (<prefix> <case>) and the headers given, and prints, one JSON line per
// case, the usage the client parsed.
// node openai.mjs <baseURL> <key prefix> <headers JSON>
import OpenAI from "openai";

const [baseURL, prefix, headers] = process.argv.slice(2);
const cases = {
  "chat json": async (c) => (await c.chat.completions.create(chat)).usage,
  "chat stream": async (c) => {
    let usage = null;
    for await (const chunk of await c.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } })) {
      if (chunk.usage) usage = chunk.usage;
    }
    return usage;
  },
  "responses json": async (c) => (await c.responses.create(responses)).usage,
  "responses stream": async (c) => {
    let usage = null;
    for await (const event of await c.responses.create({ ...responses, stream: true })) {
      if (event.type === "response.completed") usage = event.response.usage;
    }
    return usage;
  },
};
const chat = { model: "gpt-4.1-mini", messages: [{ role: "user", content: "Hello" }] };
const responses = { model: "gpt-4.1", input: "Hello" };
for (const [name, run] of Object.entries(cases)) {
  const key = `${prefix} ${name}`;
  const client = new OpenAI({ baseURL, apiKey: "sk-test", maxRetries: 0, defaultHeaders: { ...JSON.parse(headers), "X-Test-Key": key } });
  const u = await run(client);
  console.log(JSON.stringify({ key, input: u.prompt_tokens ?? u.input_tokens, output: u.completion_tokens ?? u.output_tokens }));
}
