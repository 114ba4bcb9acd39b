// A fleet of 4 Node processes on one server. The vendors count arrivals on their own clock: the
// judging mock vendor (`tollgate-mock-vendor`) sees never more than the limit in any window,
// and a vendor that escalates its Retry-After for calls during its cessation sees none.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { Client } from "../src/index.js";
import { ADMIN_TOKEN, EscalatingVendor, MockVendor, Server, serveVendor, unique } from "./support.js";

const PROCESSES = 4;
const WORKER = join(dirname(fileURLToPath(import.meta.url)), "fleet-worker.js");
const run = promisify(execFile);

let server: Server;
let client: Client;

before(async () => {
  server = await Server.start();
  client = new Client({ url: server.url, token: ADMIN_TOKEN });
});

after(async () => {
  await server.stop();
});

/** Run the fleet; every process's statuses and errors. */
async function fleet(mode: string, limits: string[], vendorUrl: string, concurrency: number, calls: number) {
  const outputs = await Promise.all(
    Array.from({ length: PROCESSES }, () =>
      run(process.execPath, [WORKER, mode, server.url, limits.join(","), vendorUrl, String(concurrency), String(calls)], {
        timeout: 300_000,
      }),
    ),
  );
  const results = outputs.map(({ stdout }) => JSON.parse(stdout.trim().split("\n").at(-1)!) as { statuses: number[]; errors: string[] });
  return { statuses: results.flatMap((result) => result.statuses), errors: results.flatMap((result) => result.errors) };
}

test("4 processes of 20 concurrent calls never exceed the limit at the vendor", async () => {
  const LIMIT = 20;
  const PERIOD_MS = 500;
  // Grants and arrivals at the vendor are apart by a delay that varies (scheduling, the
  // network); the margin absorbs up to this much spread, which on a small, busy machine is
  // generous. The vendor counts in windows of the period alone.
  const MARGIN_MS = 1_000;
  const name = unique("fleet");
  await client.limits.put(name, { kind: "rate", limit: LIMIT, period_ms: PERIOD_MS, margin_ms: MARGIN_MS });
  const vendor = await MockVendor.start({ limit: LIMIT, periodMs: PERIOD_MS, window: "sliding", headers: "none" });
  try {
    const { statuses, errors } = await fleet("acquire", [name], vendor.url, 20, 1);
    assert.deepEqual(errors, []);
    assert.equal(statuses.length, PROCESSES * 20);
    const report = await vendor.report();
    assert.equal(report.calls, PROCESSES * 20, "every call arrived");
    // The demand was four times the limit: the limiter had to hold calls back.
    assert.ok(PROCESSES * 20 >= 4 * LIMIT);
    assert.ok(report.most_in_any_window <= LIMIT, `${report.most_in_any_window} calls in one window`);
    assert.equal(report.limited, 0);
  } finally {
    await vendor.stop();
  }
});

test("4 processes through tollgateFetch cause no escalation at a vendor that escalates", async () => {
  // The host's limits: a roomy rate limit (paused on a 429) and one request in flight, so
  // that the pause is recorded before the next request may leave.
  const rateName = unique("vendor");
  await client.limits.put(rateName, { kind: "rate", limit: 10_000, period_ms: 60_000 });
  const inFlight = unique("flight");
  await client.limits.put(inFlight, { kind: "concurrency", limit: 1, lease_ttl_ms: 60_000 });
  const vendor = new EscalatingVendor(new Set([4, 20]), 1);
  const served = await serveVendor(vendor.answer);
  try {
    const { statuses, errors } = await fleet("fetch", [rateName, inFlight], served.url, 4, 4);
    assert.deepEqual(errors, []);
    assert.equal(vendor.announced, 2, "the vendor did announce cessations");
    assert.equal(vendor.escalations, 0);
    assert.deepEqual(statuses, Array(PROCESSES * 16).fill(200), "every request got through after its cessation");
  } finally {
    await served.close();
  }
});
