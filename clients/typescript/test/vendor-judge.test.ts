// tollgateFetch judged by the mock vendor (`tollgate-mock-vendor`), which counts every arrival on
// its own clock: a fleet of Node processes on the wrapper's defaults never puts more than the
// vendor's limit into any of its windows, learns a vendor's lower limit from its headers, and
// holds still when the vendor says it has nothing left.
//
// TOLLGATE_TEST_LEARN=off runs the same fleets with learning off, to see what it prevents.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { after, before, test, type TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { Client, tollgateFetch } from "../src/index.js";
import { ADMIN_TOKEN, MockVendor, type MockVendorOptions, Server, unique, type VendorReport } from "./support.js";

const PROCESSES = 3;
const WORKER = join(dirname(fileURLToPath(import.meta.url)), "fleet-worker.js");
const LEARN = process.env["TOLLGATE_TEST_LEARN"] !== "off";
const run = promisify(execFile);
/** Time for the fleet's processes to boot, on a small, busy machine. */
const START_AFTER_MS = 1500;

let server: Server;
let client: Client;

before(async () => {
  server = await Server.start();
  client = new Client({ url: server.url, token: ADMIN_TOKEN });
});

after(async () => {
  await server.stop();
});

/** Run the fleet for `seconds`, `concurrency` tasks a process; every status and error. */
async function saturate(limits: string[], vendor: MockVendor, concurrency: number, seconds: number) {
  // Together, once every process has booted: a process's start-up is not the fleet's pace.
  const start = Date.now() + START_AFTER_MS;
  const warm = unique("warm");
  await client.limits.put(warm, { kind: "rate", limit: 1000, period_ms: 1000 });
  const outputs = await Promise.all(
    Array.from({ length: PROCESSES }, () =>
      run(
        process.execPath,
        [WORKER, "saturate", server.url, limits.join(","), vendor.url, String(concurrency), String(seconds), LEARN ? "learn" : "nolearn", String(start), warm],
        { timeout: 120_000 },
      ),
    ),
  );
  const results = outputs.map(({ stdout }) => JSON.parse(stdout.trim().split("\n").at(-1)!) as { statuses: number[]; errors: string[] });
  return { statuses: results.flatMap((result) => result.statuses), errors: results.flatMap((result) => result.errors) };
}

async function withVendor(options: MockVendorOptions, work: (vendor: MockVendor) => Promise<void>): Promise<void> {
  const vendor = await MockVendor.start(options);
  try {
    await work(vendor);
  } finally {
    await vendor.stop();
  }
}

/** The vendor's figures, as the test's diagnostics. */
function record(t: TestContext, report: VendorReport, statuses: number[]): void {
  const { calls, ok, limited, most_in_any_window, windows_over, capacity, used_share } = report;
  t.diagnostic(
    `learn ${LEARN ? "on" : "off"}: ${JSON.stringify({ calls, ok, limited, most_in_any_window, windows_over, capacity, used_share, answers: statuses.length })}`,
  );
}

test("3 processes saturating on the defaults never put more than the limit into any window", async (t) => {
  const name = unique("judge");
  await client.limits.put(name, { kind: "rate", limit: 10, period_ms: 1000 });
  await withVendor({ limit: 10, periodMs: 1000, window: "sliding", headers: "none" }, async (vendor) => {
    const { statuses, errors } = await saturate([name], vendor, 5, 20);
    const report = await vendor.report();
    record(t, report, statuses);
    t.diagnostic(`the limit's state after: ${JSON.stringify(await learnedState(name))}`);
    assert.deepEqual(errors, []);
    // Saturated: the fleet asked for more than the vendor allows over the whole run.
    assert.ok(report.calls >= 100, `${report.calls} calls`);
    assert.ok(report.most_in_any_window <= 10, `${report.most_in_any_window} calls in one window of the vendor's`);
  });
});

/** The limit's learned state in `/v1/stats`. */
async function learnedState(name: string): Promise<Record<string, unknown> | undefined> {
  const response = await fetch(`${server.url}/v1/stats`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  const stats = (await response.json()) as { limits: { name: string; learned?: Record<string, unknown> }[] };
  return stats.limits.find((limit) => limit.name === name)?.learned;
}

test("a vendor's lower limit, advertised in its headers, is learned from its first answer", async (t) => {
  const name = unique("judge");
  await client.limits.put(name, { kind: "rate", limit: 20, period_ms: 1000 });
  await withVendor({ limit: 10, periodMs: 1000, window: "sliding", headers: "openai" }, async (vendor) => {
    const first = await tollgateFetch({ client, hosts: { [vendor.host]: name }, learn: LEARN })(`${vendor.url}/first`);
    assert.equal(first.status, 200);
    await first.arrayBuffer();
    const state = await learnedState(name);
    t.diagnostic(`after the first answer: ${JSON.stringify(state)}`);
    if (LEARN) {
      const learned = state?.["learned"] as { limit: number; source: string } | null | undefined;
      assert.equal(state?.["effective"], 10);
      assert.equal(learned?.limit, 10);
      assert.match(learned?.source ?? "", new RegExp(`openai headers from ${vendor.host}`));
    }
    // Judged from here on: what the first answer taught.
    await vendor.reset();
    const { statuses, errors } = await saturate([name], vendor, 5, 15);
    const report = await vendor.report();
    record(t, report, statuses);
    assert.deepEqual(errors, []);
    assert.ok(report.limited <= 1, `${report.limited} calls refused`);
    // Safety is the assertion; this floor only shows the fleet ran (how much of the vendor it
    // uses depends on the machine's load).
    assert.ok(report.used_share >= 0.3, `${report.used_share} of the vendor's capacity used`);
  });
});

test("a vendor with nothing left pauses the fleet before it refuses anything", async (t) => {
  // One call in flight fleet-wide, so that an answer's lesson is in force before the next
  // call leaves; the rate limit is far above the vendor's, which only its headers tell.
  const rate = unique("judge");
  await client.limits.put(rate, { kind: "rate", limit: 100, period_ms: 1000 });
  const inFlight = unique("flight");
  await client.limits.put(inFlight, { kind: "concurrency", limit: 1, lease_ttl_ms: 60_000 });
  await withVendor({ limit: 10, periodMs: 4000, window: "fixed", headers: "anthropic" }, async (vendor) => {
    const { statuses, errors } = await saturate([rate, inFlight], vendor, 2, 10);
    const report = await vendor.report();
    record(t, report, statuses);
    assert.deepEqual(errors, []);
    assert.equal(report.limited, 0, "the vendor refused a call");
    assert.ok(report.ok > 10, `${report.ok} calls: the fleet went on after the vendor's window reset`);
  });
});
