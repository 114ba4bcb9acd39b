// Reading a vendor's rate-limit headers on the vectors every implementation shares.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import { type Advice, readAdvice } from "../src/index.js";
import { REPOSITORY } from "./support.js";

interface Case {
  name: string;
  headers: [string, string][];
  now_ms: number;
  advice: {
    family: string;
    quotas: { quota: number; window_ms: number | null }[];
    remaining: number | null;
    reset_ms: number | null;
  } | null;
}

const VECTORS: { cases: Case[] } = JSON.parse(
  readFileSync(join(REPOSITORY, "crates", "dispatch", "tests", "vectors", "vendor_headers.json"), "utf8"),
);

/** A value as fetch's Headers hands it over: each byte of its UTF-8 one character (Latin-1). */
function wire(value: string): string {
  return Buffer.from(value, "utf8").toString("latin1");
}

/** The advice in the vectors' spelling. */
function asVector(advice: Advice | null): Case["advice"] {
  return advice === null
    ? null
    : {
        family: advice.family,
        quotas: advice.quotas.map((item) => ({ quota: item.quota, window_ms: item.windowMs })),
        remaining: advice.remaining,
        reset_ms: advice.resetMs,
      };
}

describe("the shared vendor header vectors", () => {
  assert.ok(VECTORS.cases.length > 50, "the vectors were read");
  for (const case_ of VECTORS.cases) {
    test(case_.name, () => {
      const headers = new Headers();
      for (const [name, value] of case_.headers) {
        headers.append(name, wire(value));
      }
      assert.deepEqual(asVector(readAdvice(headers, case_.now_ms)), case_.advice, JSON.stringify(case_.headers));
    });
  }
});
