// `npm pack` gives a package that installs into another project, where its ESM entry point
// imports, its type declarations check a TypeScript consumer, and it talks to the real server.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";

import { ADMIN_TOKEN, PACKAGE, Server } from "./support.js";

const run = promisify(execFile);
const NPM = process.platform === "win32" ? "npm.cmd" : "npm";

let server: Server;
let project: string;

before(async () => {
  server = await Server.start();
  project = mkdtempSync(join(tmpdir(), "tollgate-consumer-"));
});

after(async () => {
  await server.stop();
  rmSync(project, { recursive: true, force: true });
});

test("the packed package installs, imports, type-checks and works", async () => {
  const { stdout } = await run(NPM, ["pack", "--json", "--pack-destination", project], { cwd: PACKAGE });
  const [packed] = JSON.parse(stdout.slice(stdout.indexOf("["))) as { filename: string; files: { path: string }[] }[];
  const files = packed!.files.map((file) => file.path).sort();
  assert.ok(files.includes("dist/index.js") && files.includes("dist/index.d.ts"), files.join(", "));
  assert.ok(!files.some((file) => file.startsWith("src/") || file.startsWith("test/")), files.join(", "));

  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "consumer", private: true, type: "module" }));
  await run(NPM, ["install", "--offline", "--no-audit", "--no-fund", join(project, packed!.filename)], { cwd: project });

  writeFileSync(
    join(project, "consumer.ts"),
    `import { Client, RateLimited, type Permit } from "@tollgate/client";
const client = new Client({ url: process.argv[2]!, token: process.argv[3]! });
await client.limits.put("consumer", { kind: "rate", limit: 1, period_ms: 60000 });
const permit: Permit = await client.acquire("consumer", { wait: 1 });
await permit.commit();
const denied = await client.acquire("consumer").catch((error: unknown) => error);
console.log(denied instanceof RateLimited ? "denied" : "granted");
`,
  );
  writeFileSync(
    join(project, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022",
        module: "NodeNext",
        moduleResolution: "NodeNext",
        strict: true,
        lib: ["ES2023", "ESNext.Disposable"],
        types: ["node"],
        typeRoots: [join(PACKAGE, "node_modules", "@types")],
        skipLibCheck: false,
      },
      files: ["consumer.ts"],
    }),
  );
  await run(process.execPath, [join(PACKAGE, "node_modules", "typescript", "bin", "tsc"), "-p", project], { cwd: project });
  const { stdout: said } = await run(process.execPath, [join(project, "consumer.js"), server.url, ADMIN_TOKEN], { cwd: project });
  assert.equal(said.trim(), "denied");
});
