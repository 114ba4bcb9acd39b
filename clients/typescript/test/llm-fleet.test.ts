// Token budgets judged by the model, across processes: three Node processes
// (`llm-fleet-worker.ts`, three concurrent callers each) call `tollgate-mock-model` through
// `tollgateFetch({ ..., llm })` and one real `tollgate` server for TOLLGATE_LLM_SECONDS (20),
// with mixed APIs, streamed and whole answers of random lengths, every request capped, and calls
// failed, cut off or cancelled. The figures are the model's own count, never Tollgate's: no 429
// and no window over any of its limits. The output per minute it counted is printed
// (`docs/lab.md` records it).

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { accessSync, constants } from "node:fs";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Client } from "../src/index.js";
import { ADMIN_TOKEN, findBinary, Server, unique } from "./support.js";

const PROCESSES = 3;
const CALLERS = 3;
const PERIOD_MS = 5000;
const RPM = 200;
const ITPM = 60_000;
const OTPM = 6000;
const WORKER = join(dirname(fileURLToPath(import.meta.url)), "llm-fleet-worker.js");

/** The mock model's binary, or null when there is none to run. */
function modelBinary(): string | null {
  let binary: string;
  try {
    binary = process.env["TOLLGATE_MOCK_MODEL_BIN"] || join(dirname(findBinary()), "tollgate-mock-model");
    accessSync(binary, constants.X_OK);
  } catch {
    return null;
  }
  return binary;
}

const binary = modelBinary();
let server: Server;
let client: Client;

before(async () => {
  if (binary === null) return;
  server = await Server.start();
  client = new Client({ url: server.url, token: ADMIN_TOKEN });
});

after(async () => {
  if (binary !== null) await server.stop();
});

/** A child's stdout read line by line: the first line that starts with a prefix, once it comes. */
function reader(child: ChildProcess): (prefix: string) => Promise<string> {
  const seen: string[] = [];
  const waiting: Array<() => void> = [];
  let ended = false;
  const lines = createInterface({ input: child.stdout! });
  const wake = (): void => {
    for (const waiter of waiting.splice(0)) waiter();
  };
  lines.on("line", (line) => {
    seen.push(line);
    wake();
  });
  lines.on("close", () => {
    ended = true;
    wake();
  });
  return (prefix) =>
    new Promise((resolve, reject) => {
      const look = (): void => {
        const found = seen.find((line) => line.startsWith(prefix));
        if (found !== undefined) resolve(found);
        else if (ended) reject(new Error(`its output ended before "${prefix}"`));
        else waiting.push(look);
      };
      look();
    });
}

test("three processes with max_tokens never pass the model's limits", async (context) => {
  if (binary === null) {
    const message = "SKIPPED the token-budget fleet test: no tollgate-mock-model beside the tollgate binary (cargo build -p tollgate-fleet --bin tollgate-mock-model, or set TOLLGATE_MOCK_MODEL_BIN)";
    assert.notEqual(process.env["CI"], "true", message);
    console.error(`\n*** ${message} ***`);
    context.skip(message);
    return;
  }
  const seconds = Number(process.env["TOLLGATE_LLM_SECONDS"] ?? "20");
  const names = { requests: unique("llm-r"), input: unique("llm-i"), output: unique("llm-o"), overrun: unique("llm-x") };
  await client.limits.put(names.requests, { kind: "rate", limit: RPM, period_ms: PERIOD_MS });
  await client.limits.put(names.input, { kind: "rate", limit: ITPM, period_ms: PERIOD_MS });
  await client.limits.put(names.output, { kind: "rate", limit: OTPM, period_ms: PERIOD_MS });
  await client.limits.put(names.overrun, { kind: "concurrency", limit: 1, lease_ttl_ms: 120_000 });
  const args = ["--listen", "127.0.0.1:0", "--rpm", String(RPM), "--itpm", String(ITPM), "--otpm", String(OTPM), "--period-ms", String(PERIOD_MS)];
  const modelProcess = spawn(binary, args, { stdio: ["ignore", "pipe", "inherit"] });
  const workers: ChildProcess[] = [];
  try {
    const model = (await reader(modelProcess)("listening on ")).split("listening on ")[1]!.trim();
    for (let seed = 1; seed <= PROCESSES; seed++) {
      workers.push(
        spawn(process.execPath, [WORKER, server.url, model, String(CALLERS), String(seconds), String(seed), JSON.stringify(names)], {
          stdio: ["pipe", "pipe", "inherit"],
        }),
      );
    }
    const lines = workers.map(reader);
    await Promise.all(lines.map((lineOf) => lineOf("ready")));
    // The fleet starts together, once every process is up.
    for (const worker of workers) worker.stdin!.write("go\n");
    const sent = (await Promise.all(lines.map((lineOf) => lineOf("stats "))))
      .map((line) => line.split(" ").slice(1).map(Number))
      .reduce((sum, each) => sum.map((value, index) => value + each[index]!), [0, 0, 0]);
    const report = (await (await fetch(`${model}/_model/report`)).json()) as Record<string, number>;
    const perMinute = Math.round(report["output_tokens"]! / (seconds / 60));
    console.log(
      `model's count: ${report["output_tokens"]} output tokens in ${seconds} s (${perMinute} per minute; its limit ${(OTPM * 60_000) / PERIOD_MS} per minute), ` +
        `${report["input_tokens"]} input, ${report["ok"]} calls; most output in any ${PERIOD_MS} ms window ${report["most_output_in_any_window"]} of ${OTPM}, ` +
        `input ${report["most_input_in_any_window"]} of ${ITPM}, requests ${report["most_requests_in_any_window"]} of ${RPM}; 429s ${report["limited"]}; ` +
        `use ${report["output_used_share_steady"]}; workers sent/429/errors ${sent.join(" ")}`,
    );
    const shown = JSON.stringify(report);
    assert.ok(sent[0]! > 0, String(sent));
    assert.equal(sent[2], 0, String(sent));
    assert.equal(report["limited"], 0, shown);
    assert.ok(report["most_output_in_any_window"]! <= OTPM, shown);
    assert.ok(report["most_input_in_any_window"]! <= ITPM, shown);
    assert.ok(report["most_requests_in_any_window"]! <= RPM, shown);
    assert.ok(report["failed"]! + report["cut"]! + report["cancelled"]! > 0, shown);
    // Safety is the assertion; this floor only shows the fleet ran at all.
    assert.ok((report["output_used_share_steady"] ?? 0) >= 0.3, shown);
  } finally {
    for (const worker of workers) worker.kill("SIGKILL");
    modelProcess.kill("SIGKILL");
  }
});
