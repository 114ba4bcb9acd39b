// What the client puts on the wire, and how it reads answers the real server cannot be made to
// give (an internal error, a proxy's page), through a recording `fetch`.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  BadRequest,
  Client,
  type ClientOptions,
  Conflict,
  Forbidden,
  NotFound,
  RateLimited,
  ServerError,
  ServerUnreachable,
  StoreUnavailable,
  TollgateError,
  TooManyKeys,
  Unauthorized,
} from "../src/index.js";
import { json } from "./support.js";

const GRANT = { permit: "p-1", limits: [{ name: "x", remaining: 1, reset_ms: 1500 }] };

/** A mock server that answers `answer` and keeps every request. */
class Recorder {
  readonly requests: Request[] = [];
  readonly bodies: string[] = [];
  readonly signals: (AbortSignal | null | undefined)[] = [];
  answer: () => Response = () => json(200, GRANT);

  fetch = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const request = new Request(input, init);
    this.requests.push(request);
    this.bodies.push(await request.text());
    this.signals.push(init?.signal);
    return this.answer();
  };

  body(index = -1): unknown {
    return JSON.parse(this.bodies.at(index)!);
  }

  last(): Request {
    return this.requests.at(-1)!;
  }
}

function clientWith(recorder: Recorder, options: ClientOptions = {}): Client {
  return new Client({ url: "http://tollgate.test/", fetch: recorder.fetch, ...options });
}

function errorAnswer(status: number, code: string, field?: string, extra: object = {}): () => Response {
  const detail = { code, message: `${code} happened`, ...(field === undefined ? {} : { field }) };
  return () => json(status, { error: detail, ...extra });
}

test("acquire sends its body in the server's units", async () => {
  const recorder = new Recorder();
  const tollgate = clientWith(recorder);
  const permit = await tollgate.acquire("x");
  assert.deepEqual(recorder.body(), { limits: ["x"], cost: 1, priority: "normal", wait_ms: 0 });
  assert.equal(permit.limits[0]?.resetAfter, 1.5);
  assert.equal(recorder.last().url, "http://tollgate.test/v1/acquire");
  assert.equal(recorder.last().headers.get("content-type"), "application/json");
  await tollgate.acquire(["x", "y"], { key: "k", cost: 2, priority: "high", wait: 1.5 });
  assert.deepEqual(recorder.body(), { limits: ["x", "y"], key: "k", cost: 2, priority: "high", wait_ms: 1500 });
  await tollgate.acquire("x", { wait: 0.0001 });
  assert.equal((recorder.body() as { wait_ms: number }).wait_ms, 1, "a wait is rounded up, never to no wait");
  await tollgate.acquire("x", { wait: 1.1 });
  assert.equal((recorder.body() as { wait_ms: number }).wait_ms, 1100, "binary noise adds no millisecond");
});

test("arguments the client converts itself are refused before anything is sent", async () => {
  const recorder = new Recorder();
  const tollgate = clientWith(recorder);
  await assert.rejects(tollgate.acquire("x", { wait: -1 }), /wait: must be at least 0/);
  await assert.rejects(tollgate.acquire("x", { wait: Number.POSITIVE_INFINITY }), /wait: must be finite/);
  await assert.rejects(tollgate.acquire([]), /limits: name at least one limit/);
  await assert.rejects(tollgate.pause("x", { seconds: Number.NaN }), /seconds: must be at least 0/);
  assert.throws(() => new Client({ timeout: 0 }), /timeout/);
  assert.equal(recorder.requests.length, 0);
});

test("pause, commit, renew and check send the server's fields", async () => {
  const recorder = new Recorder();
  const tollgate = clientWith(recorder);
  recorder.answer = () => json(200, { paused_ms: 2500, limit: "x" });
  assert.equal(await tollgate.pause("x", { seconds: 2.5, key: "k" }), 2.5);
  assert.deepEqual(recorder.body(), { limit: "x", retry_after_ms: 2500, key: "k" });
  recorder.answer = () => json(200, GRANT);
  const permit = await tollgate.acquire("x", { cost: 2 });
  recorder.answer = () => json(200, { refunded: 1, released: 0 });
  assert.deepEqual(await permit.commit(1), { refunded: 1, released: 0 });
  assert.equal(new URL(recorder.last().url).pathname, "/v1/permits/p-1/commit");
  assert.deepEqual(recorder.body(), { used: 1 });
  recorder.answer = () => json(200, { expires_ms: 1234 });
  assert.equal(await permit.renew(), 1.234);
  assert.deepEqual(recorder.body(), {});
  recorder.answer = () => json(200, { allowed: true, path: "/a/#", matched: [], limits: [] });
  await tollgate.check({ method: "GET", path: "/a/1" });
  assert.deepEqual(recorder.body(), { method: "GET", path: "/a/1" });
});

test("permit ids and limit names are quoted in paths", async () => {
  const recorder = new Recorder();
  recorder.answer = () => json(200, { ...GRANT, permit: "a/b?c" });
  const tollgate = clientWith(recorder);
  const permit = await tollgate.acquire("x");
  recorder.answer = () => json(200, { refunded: 0, released: 0 });
  await permit.commit();
  assert.equal(recorder.last().url, "http://tollgate.test/v1/permits/a%2Fb%3Fc/commit");
  recorder.answer = () => json(200, { kind: "rate", limit: 1 });
  await tollgate.limits.get("a/b");
  assert.equal(recorder.last().url, "http://tollgate.test/v1/limits/a%2Fb");
});

test("tokens go where they belong", async () => {
  const recorder = new Recorder();
  const split = clientWith(recorder, { token: "data", adminToken: "admin" });
  await split.acquire("x");
  assert.equal(recorder.last().headers.get("authorization"), "Bearer data");
  recorder.answer = () => json(200, { kind: "rate", limit: 1 });
  await split.limits.get("x");
  assert.equal(recorder.last().headers.get("authorization"), "Bearer admin");
  await clientWith(recorder, { token: "both" }).limits.get("x");
  assert.equal(recorder.last().headers.get("authorization"), "Bearer both");
  await clientWith(recorder).limits.get("x");
  assert.equal(recorder.last().headers.get("authorization"), null);
  assert.equal(recorder.last().headers.get("content-type"), null, "a GET has no body");
});

test("a waiting acquire gets its wait on top of the timeout", async () => {
  const recorder = new Recorder();
  let timeouts = 0;
  const original = AbortSignal.timeout;
  AbortSignal.timeout = (milliseconds: number): AbortSignal => {
    timeouts = milliseconds;
    return original.call(AbortSignal, milliseconds);
  };
  try {
    await clientWith(recorder, { timeout: 2 }).acquire("x", { wait: 30 });
  } finally {
    AbortSignal.timeout = original;
  }
  assert.equal(timeouts, 32_000);
});

const CODES: [number, string, typeof TollgateError][] = [
  [400, "bad_request", BadRequest],
  [401, "unauthorized", Unauthorized],
  [403, "forbidden", Forbidden],
  [404, "not_found", NotFound],
  [409, "conflict", Conflict],
  [503, "store_unavailable", StoreUnavailable],
  [503, "too_many_keys", TooManyKeys],
  // Not provoked from the real server: it answers `internal` only on a bug.
  [500, "internal", ServerError],
];

for (const [status, code, kind] of CODES) {
  test(`${code} is a ${kind.name}`, async () => {
    const recorder = new Recorder();
    const field = code === "bad_request" ? "cost" : undefined;
    recorder.answer = errorAnswer(status, code, field);
    const error = await clientWith(recorder).acquire("x").then(
      () => assert.fail("refused"),
      (caught: unknown) => caught,
    );
    assert.ok(error instanceof kind && error instanceof TollgateError && error instanceof Error);
    assert.equal(error.constructor, kind);
    assert.equal(error.name, kind.name);
    assert.equal(error.code, code);
    assert.equal(error.message, `${code} happened`);
    assert.equal(error.field, field ?? null);
    assert.equal(error.status, status);
  });
}

test("rate_limited reads seconds, the reason and the limits", async () => {
  const recorder = new Recorder();
  recorder.answer = errorAnswer(429, "rate_limited", undefined, {
    retry_after_ms: 850,
    reason: "queued",
    limits: [{ name: "x", remaining: 0, reset_ms: 850 }],
  });
  const tollgate = clientWith(recorder);
  const error = await tollgate.acquire("x").catch((caught: unknown) => caught);
  assert.ok(error instanceof RateLimited);
  assert.equal(error.retryAfter, 0.85);
  assert.equal(error.reason, "queued");
  assert.equal(error.limits[0]?.resetAfter, 0.85);
  assert.equal(await tollgate.tryAcquire("x"), null);
});

test("answers that are not Tollgate's errors are classed by status", async () => {
  const recorder = new Recorder();
  const tollgate = clientWith(recorder);
  recorder.answer = () => new Response("<html>Bad Gateway</html>", { status: 502 });
  const gateway = await tollgate.acquire("x").catch((caught: unknown) => caught);
  assert.ok(gateway instanceof ServerError);
  assert.equal(gateway.code, "internal");
  assert.equal(gateway.status, 502);
  assert.match(gateway.message, /Bad Gateway/);
  recorder.answer = () => new Response("slow down", { status: 429, headers: { "retry-after": "7" } });
  const proxy = await tollgate.acquire("x").catch((caught: unknown) => caught);
  assert.ok(proxy instanceof RateLimited);
  assert.equal(proxy.retryAfter, 7);
  recorder.answer = errorAnswer(418, "teapot");
  const teapot = await tollgate.acquire("x").catch((caught: unknown) => caught);
  assert.ok(teapot instanceof TollgateError);
  assert.equal(teapot.constructor, TollgateError);
  assert.equal(teapot.code, "teapot");
  recorder.answer = () => new Response("ok", { status: 200 });
  await assert.rejects(tollgate.acquire("x"), ServerError);
  recorder.answer = () => json(200, { limits: [] });
  await assert.rejects(tollgate.acquire("x"), /no permit id/);
});

test("no answer at all is ServerUnreachable, with fetch's failure as the cause", async () => {
  const failure = new TypeError("fetch failed", { cause: new Error("connect ECONNREFUSED 127.0.0.1:9") });
  const tollgate = new Client({
    url: "http://127.0.0.1:9",
    fetch: () => Promise.reject(failure),
  });
  const error = await tollgate.acquire("x").catch((caught: unknown) => caught);
  assert.ok(error instanceof ServerUnreachable);
  assert.equal(error.code, "unreachable");
  assert.equal(error.status, null);
  assert.equal(error.cause, failure);
  assert.match(error.message, /127\.0\.0\.1:9: fetch failed: connect ECONNREFUSED/);
});
