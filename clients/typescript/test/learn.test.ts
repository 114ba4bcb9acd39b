// Learning a vendor's limits through tollgateFetch, against the real server: what a vendor's
// headers teach (once, and again when they change), a vendor with nothing left pausing the
// limit, a refusal without a quota, the grant-to-send delay on every commit, the off switch,
// and a lesson that fails leaving the request alone.

import assert from "node:assert/strict";
import { after, before, beforeEach, test } from "node:test";

import { BadRequest, Client, RateLimited, tollgateFetch, type TollgateFetchOptions } from "../src/index.js";
import { ADMIN_TOKEN, json, ScriptedVendor, Server, unique } from "./support.js";
import { serverHeld } from "../src/client.js";

const VENDOR = "api.vendor.test";
const FAST = { backoff: 0.01, backoffMax: 0.05, resumeJitterMax: 0.05 };

/** A request the client sent to the server: its path and JSON body. */
interface Sent {
  path: string;
  body: Record<string, unknown> | null;
}

let server: Server;
let client: Client;
let sent: Sent[] = [];
/** Paths whose requests fail here with a 500, never reaching the server. */
let failing = new Set<string>();

before(async () => {
  server = await Server.start();
  const recording: typeof fetch = async (input, init) => {
    const path = new URL(String(input)).pathname;
    sent.push({ path, body: typeof init?.body === "string" ? JSON.parse(init.body) : null });
    if (failing.has(path)) {
      return json(500, { error: { code: "internal", message: "failed on purpose" } });
    }
    return fetch(input, init);
  };
  client = new Client({ url: server.url, token: ADMIN_TOKEN, fetch: recording });
});

beforeEach(() => {
  sent = [];
  failing = new Set();
});

after(async () => {
  await server.stop();
});

async function rateLimit(limit = 100): Promise<string> {
  const name = unique("vendor");
  await client.limits.put(name, { kind: "rate", limit, period_ms: 1000 });
  return name;
}

function lessons(): Record<string, unknown>[] {
  return sent.filter((request) => request.path === "/v1/learn").map((request) => request.body!);
}

function commits(): Record<string, unknown>[] {
  return sent.filter((request) => request.path.endsWith("/commit")).map((request) => request.body!);
}

function openai(limit: number, remaining: number, reset = "1s", status = 200, headers: Record<string, string> = {}): Response {
  return json(status, {}, {
    ...headers,
    "x-ratelimit-limit-requests": String(limit),
    "x-ratelimit-remaining-requests": String(remaining),
    "x-ratelimit-reset-requests": reset,
  });
}

function vendorFetch(names: string | string[], vendor: ScriptedVendor, options: Partial<TollgateFetchOptions> = {}) {
  return tollgateFetch({ client, hosts: { [VENDOR]: names }, fetch: vendor.fetch, ...FAST, ...options });
}

test("a vendor's quota is taught once, and again when it changes", async () => {
  // Configured 50: its floor (a tenth) is below the vendor's 8.
  const name = await rateLimit(50);
  const vendor = new ScriptedVendor(openai(10, 8), openai(10, 7), openai(10, 6), openai(8, 5));
  const call = vendorFetch(name, vendor);
  for (let index = 0; index < 4; index += 1) {
    assert.equal((await call(`https://${VENDOR}/`)).status, 200);
  }
  assert.deepEqual(lessons(), [
    { limit: name, source: `openai headers from ${VENDOR}`, quotas: [{ quota: 10 }], remaining: 8, reset_ms: 1000 },
    { limit: name, source: `openai headers from ${VENDOR}`, quotas: [{ quota: 8 }], remaining: 5, reset_ms: 1000 },
  ]);
  const learned = await client.learn(name, { source: "a test", quotas: [{ quota: 8 }] });
  assert.equal(learned.configured, 50);
  assert.equal(learned.effective, 8);
  assert.equal(learned.learned?.limit, 8);
  assert.equal(learned.learned?.kind, "advertised");
});

test("a vendor with nothing left pauses the limit until its reset", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(openai(10, 0, "20s"));
  assert.equal((await vendorFetch(name, vendor)(`https://${VENDOR}/`)).status, 200);
  assert.equal(lessons().length, 1);
  const denial = await client.acquire(name).catch((caught: unknown) => caught);
  assert.ok(denial instanceof RateLimited);
  assert.equal(denial.reason, "paused");
  assert.ok(denial.retryAfter > 15 && denial.retryAfter <= 20, `${denial.retryAfter}`);
});

test("the pause a lesson caused holds the next call", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(openai(10, 0, "1s"), openai(10, 9));
  const call = vendorFetch(name, vendor, { resumeJitterMax: 0 });
  await call(`https://${VENDOR}/`);
  const started = performance.now();
  await call(`https://${VENDOR}/`);
  assert.ok(performance.now() - started >= 900, `the second call left after ${performance.now() - started} ms`);
  assert.equal(vendor.calls.length, 2);
});

test("a refusal that advertises no quota teaches rate_limited, besides the pause", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(json(429, {}, { "retry-after": "0" }), json(200));
  assert.equal((await vendorFetch(name, vendor)(`https://${VENDOR}/`)).status, 200);
  assert.deepEqual(lessons(), [{ limit: name, source: `HTTP 429 from ${VENDOR}`, quotas: [], rate_limited: true }]);
});

test("a refusal that advertises its quota teaches the quota", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(openai(10, 0, "0s", 429, { "retry-after": "0" }), json(200));
  assert.equal((await vendorFetch(name, vendor)(`https://${VENDOR}/`)).status, 200);
  const taught = lessons();
  assert.equal(taught.length, 1);
  assert.deepEqual(taught[0]!["quotas"], [{ quota: 10 }]);
  assert.equal(taught[0]!["rate_limited"], undefined);
});

test("every commit reports the grant-to-send delay", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(json(200));
  const call = vendorFetch(name, vendor);
  for (let index = 0; index < 3; index += 1) {
    await call(`https://${VENDOR}/`);
  }
  const reported = commits();
  assert.equal(reported.length, 3);
  for (const body of reported) {
    const delay = body["sent_after_ms"];
    assert.ok(typeof delay === "number" && Number.isInteger(delay) && delay >= 0 && delay < 10_000, JSON.stringify(body));
  }
  assert.deepEqual(lessons(), [], "a vendor that says nothing of its limits teaches nothing");
});

test("learn: false sends no lesson and no delay; pauses stay", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(openai(10, 5), json(429, {}, { "retry-after": "20" }));
  const call = vendorFetch(name, vendor, { learn: false, retriesMax: 0 });
  assert.equal((await call(`https://${VENDOR}/`)).status, 200);
  assert.equal((await call(`https://${VENDOR}/`)).status, 429);
  assert.deepEqual(lessons(), []);
  assert.deepEqual(commits(), [{ used: 1 }, { used: 1 }]);
  assert.equal(await client.tryAcquire(name), null, "the 429 paused the limit");
  assert.throws(() => vendorFetch(name, vendor, { learn: "no" as never }), /^TypeError: learn:/);
});

test("a lesson that fails never fails the request", async () => {
  const name = await rateLimit();
  failing.add("/v1/learn");
  const vendor = new ScriptedVendor(openai(10, 0, "1s"), json(429, {}, { "retry-after": "0" }), json(200));
  const call = vendorFetch(name, vendor);
  assert.equal((await call(`https://${VENDOR}/`)).status, 200);
  assert.equal((await call(`https://${VENDOR}/`)).status, 200, "after the refusal, the retry");
  assert.equal(lessons().length, 2, "both lessons were tried");
});

test("Client.learn sends seconds as milliseconds, and a bad lesson names its field", async () => {
  const name = await rateLimit(50);
  const learnt = await client.learn(name, { source: "a test", quotas: [{ quota: 600, window: 60 }], remaining: 3, reset: 0.25 });
  assert.deepEqual(lessons().at(-1), {
    limit: name,
    source: "a test",
    quotas: [{ quota: 600, window_ms: 60_000 }],
    remaining: 3,
    reset_ms: 250,
  });
  assert.equal(learnt.limit, name);
  assert.equal(learnt.configured, 50);
  assert.equal(learnt.effective, 10, "600 a minute is 10 a second");
  assert.equal(learnt.paused, 0);
  assert.ok(learnt.learned !== null && learnt.learned.expiresIn > 0);
  const bad = await client.learn(name, { source: "" }).catch((caught: unknown) => caught);
  assert.ok(bad instanceof BadRequest);
  assert.equal(bad.field, "source");
  await assert.rejects(client.learn(name, { source: "x", reset: -1 }), /^RangeError: reset:/);
});

test("the server's hold of an acquire is read from its Server-Timing", () => {
  assert.equal(serverHeld("acquire;dur=12.5"), 0.0125);
  assert.equal(serverHeld("db;dur=1, acquire; dur=3"), 0.003);
  for (const bad of [null, "", "acquire", "acquire;dur=-1", "acquire;dur=NaN", "acquire;dur=", "other;dur=3"]) {
    assert.equal(serverHeld(bad), null, String(bad));
  }
});
