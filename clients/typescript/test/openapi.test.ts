// The client's wire types against the real server's /openapi.json: the document's types are
// generated with openapi-typescript, and test/wire/check.ts, which holds src/wire.ts to them,
// must compile; test/wire/canary.ts, three deliberate mismatches, must not.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";

import openapiTS, { astToString } from "openapi-typescript";

import { PACKAGE, Server } from "./support.js";

const WIRE = join(PACKAGE, "test", "wire");
const TSC = join(PACKAGE, "node_modules", "typescript", "bin", "tsc");

let server: Server;

before(async () => {
  server = await Server.start();
  const document = await (await fetch(`${server.url}/openapi.json`)).json();
  writeFileSync(join(WIRE, "openapi.ts"), astToString(await openapiTS(document as never)));
});

after(async () => {
  await server.stop();
});

/** Compile with `project`; its exit code and diagnostics. */
async function compile(project: string): Promise<{ code: number; output: string }> {
  try {
    const { stdout } = await promisify(execFile)(process.execPath, [TSC, "-p", join(WIRE, project)], { cwd: PACKAGE });
    return { code: 0, output: stdout };
  } catch (error) {
    const failed = error as { code: number; stdout: string };
    return { code: failed.code, output: failed.stdout };
  }
}

test("every body the client sends and every answer it reads is as the document says", async () => {
  const { code, output } = await compile("tsconfig.json");
  assert.equal(code, 0, output);
});

test("the check fails on a field the document does not name or a type it does not accept", async () => {
  const { code, output } = await compile("tsconfig.canary.json");
  assert.notEqual(code, 0);
  const errors = output.split("\n").filter((line) => line.includes("error TS"));
  assert.deepEqual(
    errors.map((line) => /canary\.ts\((\d+),/.exec(line)?.[1]),
    ["9", "10", "11"],
    output,
  );
});
