// Which server a kept admin token goes to, and where it is looked for: the cases every
// implementation shares (crates/cli/tests/vectors/kept_token.json; the `tollgate` commands and
// the Python client answer them too).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { belongsTo, userCopyPath } from "../src/kept.js";
import { REPOSITORY } from "./support.js";

const VECTORS: {
  belongs: { listen: string | null; url: string; sends: boolean }[];
  user_copy: { XDG_STATE_HOME: string | null; HOME: string | null; port: number; path: string | null }[];
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
