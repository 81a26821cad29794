// Drives the official Anthropic Node client against baseURL: Messages, JSON
// and streaming (the client's own accumulation of the stream's events),
// each case with its own X-Test-Key (<prefix> <case>) and the headers
// given, and prints, one JSON line per case, the usage the client parsed,
// its input with the cache's reads and writes, as Anthropic bills them.
// node anthropic.mjs <baseURL> <key prefix> <headers JSON>
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, prefix, headers] = process.argv.slice(2);
const params = { model: "claude-sonnet-4-20250514", max_tokens: 1024, messages: [{ role: "user", content: "Hello" }] };
const cases = {
  "messages json": (c) => c.messages.create(params),
  "messages stream": (c) => c.messages.stream(params).finalMessage(),
};
for (const [name, run] of Object.entries(cases)) {
  const key = `${prefix} ${name}`;
  const client = new Anthropic({ baseURL, apiKey: "sk-ant-test", maxRetries: 0, defaultHeaders: { ...JSON.parse(headers), "X-Test-Key": key } });
  const u = (await run(client)).usage;
  const input = u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0);
  console.log(JSON.stringify({ key, input, output: u.output_tokens }));
}
