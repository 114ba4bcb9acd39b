// Estimating a language-model request and reading its answer's usage, on the vectors every
// implementation shares; the answers are also fed split at every byte, byte by byte, and cut at
// every byte.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import { type Budget, estimate, recognise, type Usage, UsageReader } from "../src/index.js";
import { REPOSITORY } from "./support.js";

interface Config {
  output_default: number;
  models: Record<string, number>;
  per_message: number;
  per_request: number;
}

interface EstimateCase {
  name: string;
  path: string;
  body: string;
  input_tokens?: number;
  config?: Partial<Config>;
  expect: { api: string | null; error?: string; input?: number; output?: number; bounded?: boolean; stream?: boolean };
}

interface UsageCase {
  name: string;
  api: string;
  events: boolean;
  body: string;
  expect: Usage;
}

const DIRECTORY = join(REPOSITORY, "crates", "dispatch", "tests", "vectors");
const ESTIMATE: { config: Config; cases: EstimateCase[] } = JSON.parse(readFileSync(join(DIRECTORY, "llm_estimate.json"), "utf8"));
const USAGE: { cases: UsageCase[] } = JSON.parse(readFileSync(join(DIRECTORY, "llm_usage.json"), "utf8"));

describe("the shared estimate vectors", () => {
  assert.ok(ESTIMATE.cases.length >= 30, "the vectors were read");
  for (const case_ of ESTIMATE.cases) {
    test(case_.name, () => {
      const api = recognise(case_.path);
      assert.equal(api, case_.expect.api);
      if (api === null) return;
      const config = { ...ESTIMATE.config, ...case_.config };
      const budget: Budget = {
        requests: "r",
        input: "i",
        output: "o",
        outputDefault: config.output_default,
        models: config.models,
        perMessage: config.per_message,
        perRequest: config.per_request,
      };
      const error = case_.expect.error;
      if (error !== undefined) {
        assert.throws(() => estimate(api, case_.body, budget, case_.input_tokens), (thrown: Error) => thrown.message.startsWith(`${error}: `));
        return;
      }
      assert.deepEqual({ api, ...estimate(api, case_.body, budget, case_.input_tokens) }, case_.expect);
    });
  }
});

function read(events: boolean, chunks: Uint8Array[]): Usage {
  const reader = new UsageReader(events);
  for (const chunk of chunks) reader.feed(chunk);
  reader.end();
  return { ...reader.usage };
}

describe("the shared usage vectors", () => {
  assert.ok(USAGE.cases.length >= 30, "the vectors were read");
  for (const case_ of USAGE.cases) {
    test(case_.name, () => {
      const body = new TextEncoder().encode(case_.body);
      const whole = read(case_.events, [body]);
      assert.deepEqual(whole, case_.expect);
      // Chunks split anywhere, mid-line or mid-character, read the same.
      for (let at = 0; at <= body.length; at++) {
        assert.deepEqual(read(case_.events, [body.subarray(0, at), body.subarray(at)]), whole, `split at ${at}`);
      }
      const bytes = Array.from({ length: body.length }, (_, at) => body.subarray(at, at + 1));
      assert.deepEqual(read(case_.events, bytes), whole, "byte by byte");
      // Cut at any byte: read without fault, never more text than the whole.
      for (let at = 0; at < body.length; at++) {
        assert.ok(read(case_.events, [body.subarray(0, at)]).streamed <= whole.streamed, `cut at ${at}`);
      }
    });
  }
});
