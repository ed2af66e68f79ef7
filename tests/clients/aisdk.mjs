// The Vercel AI SDK against `specllama serve`: node aisdk.mjs BASE_URL MODEL prints one JSON
// object, a key per case, each what the SDK returned (or {error}), for tests/test_clients.py.
// BASE_URL ends in /v1, as both providers take it.
import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, jsonSchema, streamText, tool } from "ai";

const [baseURL, modelName] = process.argv.slice(2);
const openai = createOpenAICompatible({
  name: "specllama", baseURL, apiKey: "unused",
  // response_format json_schema for generateObject (else json_object, no schema)
  supportsStructuredOutputs: true,
  includeUsage: true, // stream_options.include_usage: streamText's usage
});
const anthropic = createAnthropic({ baseURL, apiKey: "unused" });
const PROMPT = "Tell me about the rivers and the hills of France.";
const greedy = { prompt: PROMPT, maxOutputTokens: 16, temperature: 0, maxRetries: 0 };
const CITY = {
  type: "object", additionalProperties: false, required: ["name", "continent"],
  properties: { name: { type: "string", maxLength: 16 },
                continent: { type: "string", enum: ["Europe", "Asia", "Africa"] } },
};

const cases = {
  async generateText() {
    const r = await generateText({ model: openai(modelName), ...greedy });
    return { text: r.text, finishReason: r.finishReason, usage: r.usage };
  },
  async streamText() {
    const r = streamText({ model: openai(modelName), ...greedy });
    const chunks = [];
    for await (const chunk of r.textStream) chunks.push(chunk);
    return { chunks, text: await r.text, finishReason: await r.finishReason,
             usage: await r.usage };
  },
  async generateObject() {
    const r = await generateObject({
      model: openai(modelName), schema: jsonSchema(CITY), schemaName: "city",
      prompt: "Tell me about Paris.", maxOutputTokens: 300, temperature: 1, seed: 3,
      maxRetries: 0,
    });
    return { object: r.object, finishReason: r.finishReason };
  },
  async tools() {
    const ran = [];
    const weather = tool({
      description: "The weather in a city.",
      inputSchema: jsonSchema({
        type: "object", additionalProperties: false, required: ["city"],
        properties: { city: { type: "string", maxLength: 16 } },
      }),
      execute: async ({ city }) => { ran.push(city); return `sunny in ${city}`; },
    });
    const r = await generateText({
      model: openai(modelName), tools: { weather }, toolChoice: "required",
      prompt: "What is the weather in Paris?", maxOutputTokens: 300, temperature: 1, seed: 3,
      maxRetries: 0,
      // keys the provider does not know go into the request's body as they are
      providerOptions: { specllama: { parallel_tool_calls: false } },
    });
    return { ran, finishReason: r.finishReason,
             toolCalls: r.toolCalls.map((c) => ({ toolName: c.toolName, input: c.input })),
             toolResults: r.toolResults.map((c) => ({ toolName: c.toolName, output: c.output })) };
  },
  async anthropic() {
    const r = await generateText({ model: anthropic(modelName), ...greedy });
    return { text: r.text, finishReason: r.finishReason, usage: r.usage };
  },
};

const results = {};
for (const [name, run] of Object.entries(cases)) {
  try {
    results[name] = await run();
  } catch (e) {
    results[name] = { error: `${e?.name}: ${e?.message} ${e?.responseBody ?? ""}` };
  }
}
console.log(JSON.stringify(results));
