// Which server a kept admin token goes to, where it is looked for, and the proof a server gives
// before it is sent: the cases every implementation shares
// (crates/cli/tests/vectors/kept_token.json; the `tollgate` commands and the Python client
// answer them too).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import {
  baseFor,
  belongsTo,
  PROOF_LABEL,
  PROOF_NONCE_PARAMETER,
  PROOF_PATH,
  proof,
  proofNonce,
  proved,
  userCopyPath,
} from "../src/kept.js";
import { REPOSITORY } from "./support.js";

const VECTORS: {
  belongs: { listen: string | null; url: string; sends: boolean }[];
  user_copy: { XDG_STATE_HOME: string | null; HOME: string | null; port: number; path: string | null }[];
  connect: { listen: string | null; url: string; base: string | null }[];
  proof: {
    path: string;
    nonce_parameter: string;
    label: string;
    nonce_hex_min: number;
    nonce_hex_max: number;
    cases: { token: string; listen: string; nonce: string; proof: string }[];
  };
} = JSON.parse(readFileSync(join(REPOSITORY, "crates", "cli", "tests", "vectors", "kept_token.json"), "utf8"));

test("a kept token goes where the shared vectors say", () => {
  assert.ok(VECTORS.belongs.length > 20, "the vectors were read");
  for (const { listen, url, sends } of VECTORS.belongs) {
    assert.equal(belongsTo(listen, url), sends, `${listen} ${url}`);
  }
});

test("the user's copy is looked for where the shared vectors say", () => {
  const saved = { XDG_STATE_HOME: process.env["XDG_STATE_HOME"], HOME: process.env["HOME"] };
  try {
    for (const testCase of VECTORS.user_copy) {
      for (const name of ["XDG_STATE_HOME", "HOME"] as const) {
        const value = testCase[name];
        if (value === null) {
          delete process.env[name];
        } else {
          process.env[name] = value;
        }
      }
      assert.equal(userCopyPath(testCase.port) ?? null, testCase.path, JSON.stringify(testCase));
    }
  } finally {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) {
        delete process.env[name];
      } else {
        process.env[name] = value;
      }
    }
  }
});

test("the proof's constants and answers are the shared ones", () => {
  const vectors = VECTORS.proof;
  assert.equal(vectors.path, PROOF_PATH);
  assert.equal(vectors.nonce_parameter, PROOF_NONCE_PARAMETER);
  assert.equal(vectors.label, PROOF_LABEL);
  const nonce = proofNonce();
  assert.ok(vectors.nonce_hex_min <= nonce.length && nonce.length <= vectors.nonce_hex_max, nonce);
  assert.ok(vectors.cases.length >= 5, "the vectors were read");
  for (const testCase of vectors.cases) {
    assert.equal(proof(testCase.token, testCase.listen, testCase.nonce), testCase.proof, JSON.stringify(testCase));
    assert.ok(proved(testCase.token, testCase.listen, testCase.nonce, { proof: testCase.proof }));
    assert.ok(!proved(testCase.token, testCase.listen, testCase.nonce, { proof: "0".repeat(64) }));
    assert.ok(!proved(testCase.token, testCase.listen, testCase.nonce, null));
  }
});

test("a kept token is sent to the address the shared vectors say", () => {
  for (const { listen, url, base } of VECTORS.connect) {
    assert.equal(baseFor(listen, url) ?? null, base, `${listen} ${url}`);
  }
});
