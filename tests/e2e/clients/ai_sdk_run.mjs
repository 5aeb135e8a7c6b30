// One Vercel AI SDK run through Switchyard (run by tests/e2e/test_responses_agents.py, copied next to
// the node_modules of .tools/ai-sdk so that its imports resolve). `openai(model)` is the Responses
// API provider; `generateText` and `streamText` with one tool and up to 3 steps. Prints JSON.
//
// Usage: node ai_sdk_run.mjs BASE_URL MODEL
import * as ai from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { z } from "zod";

const [base, model] = process.argv.slice(2);
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: "sk-ai-sdk" });
const stepLimit = (ai.isStepCount ?? ai.stepCountIs)(3);
const tools = {
  get_weather: ai.tool({
    description: "Current weather for a city",
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => `sunny in ${city}`,
  }),
};
const prompt = "Weather in Paris?\n#mock tool_calls=1";

const result = await ai.generateText({ model: openai(model), tools, stopWhen: stepLimit, prompt });
const streamed = ai.streamText({ model: openai(model), tools, stopWhen: stepLimit, prompt });
let streamText = "";
for await (const piece of streamed.textStream) streamText += piece;

console.log(JSON.stringify({
  text: result.text,
  steps: result.steps.length,
  toolCalls: result.steps.flatMap((s) => s.toolCalls).map((c) => ({ toolName: c.toolName, input: c.input })),
  streamText,
}));
