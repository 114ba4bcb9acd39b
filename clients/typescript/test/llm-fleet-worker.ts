// One process of the token-budget fleet test (`llm-fleet.test.ts`): CALLERS tasks call the mock
// model through `tollgateFetch({ ..., llm })` until SECONDS have passed, each calling again as
// soon as its call ends: chat completions, responses or messages at random, 70 % streamed,
// random lengths, every request setting its output cap, 5 % failed by the model, 5 % cut off,
// 5 % of streams cancelled by the caller.
//
//   node llm-fleet-worker.js SERVER_URL MODEL_URL CALLERS SECONDS SEED BUDGET_JSON
//
// Prints `ready`, waits for a line on stdin, runs, and prints `stats <sent> <vendor_429> <errors>`.

import { createInterface } from "node:readline";

import { type Budget, Client, tollgateFetch } from "../src/index.js";

/** Every request's output cap; the model writes 10 to this many tokens. */
const CAP = 300;

const [server, model, callers, seconds, seed, budgetJson] = process.argv.slice(2);
const budget = JSON.parse(budgetJson!) as Budget;
const client = new Client({ url: server!, timeout: 60 });
const call = tollgateFetch({ client, hosts: {}, llm: { [new URL(model!).host]: budget } });

function generator(start: number): () => number {
  let state = start;
  return () => {
    state = (state * 16807) % 2147483647;
    return state / 2147483647;
  };
}

async function oneCall(random: () => number): Promise<number> {
  const [path, cap, key] = [
    ["/v1/chat/completions", "max_tokens", "messages"],
    ["/v1/responses", "max_output_tokens", "input"],
    ["/v1/messages", "max_tokens", "messages"],
  ][Math.floor(random() * 3)]!;
  const stream = random() < 0.7;
  const tokens = 10 + Math.floor(random() * (CAP - 9));
  const headers: Record<string, string> = { "x-mock-tokens": String(tokens), "Content-Type": "application/json" };
  const chance = random();
  if (chance < 0.05) headers["x-mock-fail-after"] = String(Math.floor(random() * tokens));
  else if (chance < 0.1) headers["x-mock-cut-after"] = String(Math.floor(random() * tokens));
  const cancelAfter = stream && chance >= 0.95 ? 1 + Math.floor(random() * 8) : null;
  const body = JSON.stringify({ model: "mock-1", [cap!]: CAP, stream, [key!]: [{ role: "user", content: "word ".repeat(4 + Math.floor(random() * 77)) }] });
  let answer: Response;
  try {
    answer = await call(`${model}${path}`, { method: "POST", body, headers });
  } catch (error) {
    if ((error as { cause?: unknown }).cause !== undefined) return 0; // cut off on demand
    throw error;
  }
  const reader = answer.body!.getReader();
  try {
    for (let chunks = 0; ; chunks++) {
      if (cancelAfter !== null && chunks >= cancelAfter) {
        await reader.cancel(); // cancelled: settles what streamed
        break;
      }
      if ((await reader.read()).done) break;
    }
  } catch {
    return 0; // cut off on demand
  }
  return answer.status;
}

const tally = { sent: 0, limited: 0, errors: 0 };
console.log("ready");
const lines = createInterface({ input: process.stdin });
await new Promise<void>((resolve) => lines.once("line", () => resolve()));
lines.close();
const until = Date.now() + Number(seconds) * 1000;
await Promise.all(
  Array.from({ length: Number(callers) }, async (_, index) => {
    const random = generator(Number(seed) * 1000 + index + 1);
    while (Date.now() < until) {
      try {
        const status = await oneCall(random);
        tally.sent += 1;
        if (status === 429) tally.limited += 1;
      } catch (error) {
        console.error(`error: ${error instanceof Error ? error.message : String(error)}`);
        tally.errors += 1;
      }
    }
  }),
);
console.log(`stats ${tally.sent} ${tally.limited} ${tally.errors}`);
process.exit(0);
