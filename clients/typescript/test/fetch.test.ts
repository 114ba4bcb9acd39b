// tollgateFetch against the real server, with scripted vendors: quota before each request,
// fleet-wide pauses on rate-limit answers, bounded retries, and a vendor that escalates its
// wait for every call during a cessation it announced (the wrapper causes none).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { BadRequest, Client, RateLimited, tollgateFetch, type TollgateFetchOptions, Verdict } from "../src/index.js";
import { ADMIN_TOKEN, EscalatingVendor, json, ScriptedVendor, Server, unique } from "./support.js";

const MINUTE_MS = 60_000;
const VENDOR = "api.vendor.test";
/** Small waits, so that retries are quick; the server still decides every grant. */
const FAST = { backoff: 0.01, backoffMax: 0.05, resumeJitterMax: 0.05 };

let server: Server;
let client: Client;

before(async () => {
  server = await Server.start();
  client = new Client({ url: server.url, token: ADMIN_TOKEN });
});

after(async () => {
  await server.stop();
});

async function rateLimit(limit = 1000, fields: Record<string, unknown> = {}): Promise<string> {
  const name = unique("vendor");
  await client.limits.put(name, { kind: "rate", limit, period_ms: MINUTE_MS, ...fields });
  return name;
}

const ok = (): Response => json(200, { ok: true });

function vendorFetch(
  hosts: Record<string, string | string[]>,
  vendor: ScriptedVendor,
  options: Partial<TollgateFetchOptions> = {},
): ReturnType<typeof tollgateFetch> {
  return tollgateFetch({ client, hosts, fetch: vendor.fetch, ...options });
}

test("each request takes a unit, and none is sent without one", async () => {
  const name = await rateLimit(2);
  const vendor = new ScriptedVendor(ok());
  const call = vendorFetch({ [VENDOR]: name }, vendor, { waitMax: 0.2 });
  assert.equal((await call(`https://${VENDOR}/a`)).status, 200);
  assert.equal((await call(`https://${VENDOR}/b`, { method: "POST", body: '{"x":1}' })).status, 200);
  const denied = await call(`https://${VENDOR}/c`).catch((caught: unknown) => caught);
  assert.ok(denied instanceof RateLimited);
  assert.match(denied.message, new RegExp(name));
  assert.equal(vendor.calls.length, 2, "the third request never left");
  assert.equal(await client.tryAcquire(name), null);
});

test("unmapped hosts pass through untouched", async () => {
  const name = await rateLimit(1);
  const vendor = new ScriptedVendor(ok());
  const call = vendorFetch({ [VENDOR]: name }, vendor);
  for (let index = 0; index < 3; index += 1) {
    assert.equal((await call("https://elsewhere.test/")).status, 200);
  }
  assert.equal(vendor.calls.length, 3);
  assert.notEqual(await client.tryAcquire(name), null, "no unit was taken");
});

test("a 429 pauses the limit on the server", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(json(429, {}, { "retry-after": "20" }));
  const response = await vendorFetch({ [VENDOR]: name }, vendor, { retriesMax: 0, ...FAST })(`https://${VENDOR}/`);
  assert.equal(response.status, 429, "with retries spent, the vendor's answer comes back");
  const denial = await client.acquire(name).catch((caught: unknown) => caught);
  assert.ok(denial instanceof RateLimited);
  assert.equal(denial.reason, "paused");
  assert.ok(denial.retryAfter >= 19, `${denial.retryAfter}`);
});

test("a 503 with Retry-After pauses, and one without is retried", async () => {
  const shedding = await rateLimit();
  const vendor = new ScriptedVendor(json(503, {}, { "retry-after": "20" }));
  assert.equal((await vendorFetch({ [VENDOR]: shedding }, vendor, { retriesMax: 0, ...FAST })(`https://${VENDOR}/`)).status, 503);
  assert.equal(await client.tryAcquire(shedding), null, "paused");
  const failing = await rateLimit();
  const flaky = new ScriptedVendor(json(503), ok());
  assert.equal((await vendorFetch({ [VENDOR]: failing }, flaky, FAST)(`https://${VENDOR}/`)).status, 200);
  assert.equal(flaky.calls.length, 2);
  assert.notEqual(await client.tryAcquire(failing), null, "not paused");
});

test("retries are bounded, and Retry-After: 0 pauses nothing", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(json(429, {}, { "retry-after": "0" }));
  assert.equal((await vendorFetch({ [VENDOR]: name }, vendor, { retriesMax: 2, ...FAST })(`https://${VENDOR}/`)).status, 429);
  assert.equal(vendor.calls.length, 3, "one attempt and two retries");
  assert.notEqual(await client.tryAcquire(name), null, "no pause was invented");
});

test("transient failures are retried for idempotent methods only", async () => {
  const name = await rateLimit();
  const put = new ScriptedVendor(json(502), ok());
  assert.equal((await vendorFetch({ [VENDOR]: name }, put, FAST)(`https://${VENDOR}/`, { method: "PUT", body: "x" })).status, 200);
  assert.equal(put.calls.length, 2);
  const post = new ScriptedVendor(json(502), ok());
  assert.equal((await vendorFetch({ [VENDOR]: name }, post, FAST)(`https://${VENDOR}/`, { method: "POST", body: "x" })).status, 502);
  assert.equal(post.calls.length, 1, "a POST that failed may have been done: not retried");
  const refused = () => new TypeError("fetch failed", { cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }) });
  const flaky = new ScriptedVendor(refused(), ok());
  assert.equal((await vendorFetch({ [VENDOR]: name }, flaky, FAST)(`https://${VENDOR}/`)).status, 200);
  assert.equal(flaky.calls.length, 2);
  const down = new ScriptedVendor(refused());
  await assert.rejects(vendorFetch({ [VENDOR]: name }, down, { retriesMax: 1, ...FAST })(`https://${VENDOR}/`), /fetch failed/);
  assert.equal(down.calls.length, 2);
  const broken = new ScriptedVendor(new TypeError("Invalid URL"), ok());
  await assert.rejects(vendorFetch({ [VENDOR]: name }, broken, FAST)(`https://${VENDOR}/`), /Invalid URL/);
  assert.equal(broken.calls.length, 1, "a failure that no retry mends is not retried");
});

test("a rate-limited POST is retried whole, but a streamed body is sent once", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(json(429, {}, { "retry-after": "0" }), ok());
  const call = vendorFetch({ [VENDOR]: name }, vendor, FAST);
  assert.equal((await call(`https://${VENDOR}/`, { method: "POST", body: '{"a":1}' })).status, 200);
  assert.deepEqual(vendor.bodies, ['{"a":1}', '{"a":1}']);
  const streamed = new ScriptedVendor(json(429, {}, { "retry-after": "20" }), ok());
  const body = new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode("chunk"));
      controller.close();
    },
  });
  const answer = await vendorFetch({ [VENDOR]: name }, streamed, FAST)(`https://${VENDOR}/`, {
    method: "POST",
    body,
    duplex: "half",
  } as RequestInit);
  assert.equal(answer.status, 429);
  assert.deepEqual(streamed.bodies, ["chunk"]);
  assert.equal(await client.tryAcquire(name), null, "its rate-limit answer still paused the host");
});

test("a request's priority comes from init.tollgate", async () => {
  const name = await rateLimit(2, { reserve: { high: 1 } });
  const vendor = new ScriptedVendor(ok());
  const call = vendorFetch({ [VENDOR]: name }, vendor, { waitMax: 0.2, priority: "low" });
  assert.equal((await call(`https://${VENDOR}/`)).status, 200);
  await assert.rejects(call(`https://${VENDOR}/`), RateLimited);
  assert.equal((await call(`https://${VENDOR}/`, { tollgate: { priority: "high" } })).status, 200);
  const bad = await call(`https://${VENDOR}/`, { tollgate: { priority: "urgent" as never } }).catch((caught: unknown) => caught);
  assert.ok(bad instanceof BadRequest);
  assert.equal(bad.field, "priority");
  assert.equal(vendor.calls.length, 2);
});

test("a user rule runs before the defaults", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(json(400, {}, { "x-quota-exceeded": "1" }));
  const classify = (response: Response) =>
    response.status === 400 && response.headers.has("x-quota-exceeded") ? Verdict.rateLimited(20) : null;
  const response = await vendorFetch({ [VENDOR]: name }, vendor, { retriesMax: 0, classify, ...FAST })(`https://${VENDOR}/`);
  assert.equal(response.status, 400);
  assert.equal(await client.tryAcquire(name), null, "the rule's verdict paused the host");
});

test("a pause known here that outlasts waitMax fails at once", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(json(429, {}, { "retry-after": "30" }), ok());
  const error = await vendorFetch({ [VENDOR]: name }, vendor, { retriesMax: 1, waitMax: 1, ...FAST })(`https://${VENDOR}/`).catch(
    (caught: unknown) => caught,
  );
  assert.ok(error instanceof RateLimited);
  assert.equal(error.reason, "paused");
  assert.ok(error.retryAfter > 25, `${error.retryAfter}`);
  assert.equal(vendor.calls.length, 1, "the retry waits for the pause, and the pause is too long");
});

test("a caller's abort ends the wait for quota", async () => {
  const name = await rateLimit();
  const vendor = new ScriptedVendor(json(429, {}, { "retry-after": "30" }), ok());
  const call = vendorFetch({ [VENDOR]: name }, vendor, { retriesMax: 0, ...FAST });
  await call(`https://${VENDOR}/`);
  const started = performance.now();
  await assert.rejects(call(`https://${VENDOR}/`, { signal: AbortSignal.timeout(200) }), { name: "TimeoutError" });
  assert.ok(performance.now() - started < 20_000, "it did not wait out the pause");
  assert.equal(vendor.calls.length, 1);
});

// ---- a vendor that escalates ----------------------------------------------------------------

test("no escalation among concurrent requests of one process", async () => {
  // A host's limits: a roomy rate limit (paused on a 429) and one request in flight.
  const rateName = await rateLimit(10_000);
  const inFlight = unique("flight");
  await client.limits.put(inFlight, { kind: "concurrency", limit: 1, lease_ttl_ms: MINUTE_MS });
  const escalating = new EscalatingVendor(new Set([3, 12]), 1);
  const vendorAsFetch = async (): Promise<Response> => {
    const { status, headers } = escalating.answer();
    return json(status, {}, headers);
  };
  const call = tollgateFetch({ client, hosts: { [VENDOR]: [rateName, inFlight] }, fetch: vendorAsFetch, retriesMax: 5 });
  const worker = async (): Promise<number[]> => {
    const statuses = [];
    for (let index = 0; index < 3; index += 1) {
      statuses.push((await call(`https://${VENDOR}/`)).status);
    }
    return statuses;
  };
  const results = await Promise.all(Array.from({ length: 6 }, worker));
  assert.equal(escalating.announced, 2);
  assert.equal(escalating.escalations, 0);
  assert.deepEqual(results.flat(), Array(18).fill(200));
});
