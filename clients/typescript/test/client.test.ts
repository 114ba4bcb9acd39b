// The client against the real server (started from $TOLLGATE_BIN): the admin API, permits and
// how they settle, pauses, inbound checks, and each error class as the server provokes it.

import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import {
  BadRequest,
  Client,
  Conflict,
  NotFound,
  RateLimited,
  ServerUnreachable,
  StoreUnavailable,
  TollgateError,
  TooManyKeys,
  Unauthorized,
} from "../src/index.js";
import { ADMIN_TOKEN, Server, unique } from "./support.js";

const MINUTE_MS = 60_000;

let server: Server;
let client: Client;

// A client with no URL or token looks for them in the environment, and for a local server's
// admin token in the user's state directory: none of them is the developer's here.
delete process.env["TOLLGATE_ADMIN_TOKEN"];
delete process.env["TOLLGATE_DATA_TOKEN"];
delete process.env["TOLLGATE_SERVER"];
const isolatedState = mkdtempSync(join(tmpdir(), "tollgate-ts-state-"));
process.env["XDG_STATE_HOME"] = isolatedState;

before(async () => {
  server = await Server.start();
  client = new Client({ url: server.url, token: ADMIN_TOKEN });
});

after(async () => {
  await server.stop();
});

async function rate(limit: number, fields: Record<string, unknown> = {}): Promise<string> {
  const name = unique("rate");
  await client.limits.put(name, { kind: "rate", limit, period_ms: MINUTE_MS, ...fields });
  return name;
}

async function concurrency(limit: number): Promise<string> {
  const name = unique("slots");
  await client.limits.put(name, { kind: "concurrency", limit, lease_ttl_ms: MINUTE_MS });
  return name;
}

/** Units left of a rate limit, read by taking none: a zero-wait acquire of what remains. */
async function remaining(name: string): Promise<number> {
  const permit = await client.acquire(name);
  await permit.commit(0);
  return permit.limits[0]!.remaining + 1;
}

// ---- admin ----------------------------------------------------------------------------------

test("limits are put, got, listed and deleted", async () => {
  const name = unique();
  const stored = await client.limits.put(name, { kind: "rate", limit: 10, period_ms: 1000, reserve: { high: 2 } });
  assert.equal(stored.kind, "rate");
  assert.equal(stored.limit, 10);
  assert.equal(stored.algorithm, "sliding", "the default is filled in");
  assert.deepEqual(await client.limits.get(name), stored);
  const listed = await client.limits.list();
  assert.ok(listed.version > 0);
  assert.ok(listed.limits.some((limit) => limit.name === name));
  assert.deepEqual(listed.rejected, []);
  await client.limits.delete(name);
  await assert.rejects(client.limits.get(name), NotFound);
  await assert.rejects(client.limits.delete(name), NotFound);
});

test("a bad limit is refused naming the field", async () => {
  const error = await client.limits
    .put(unique(), { kind: "rate", limit: 10, period_ms: 1000, bogus: 1 } as never)
    .catch((caught: unknown) => caught);
  assert.ok(error instanceof BadRequest);
  assert.equal(error.field, "bogus");
  const missing = await client.limits.put(unique(), { kind: "rate", limit: 10 } as never).catch((caught: unknown) => caught);
  assert.ok(missing instanceof BadRequest);
  assert.equal(missing.field, "period_ms");
});

test("the admin API without or with a wrong token is unauthorized", async () => {
  await assert.rejects(new Client({ url: server.url }).limits.list(), Unauthorized);
  await assert.rejects(new Client({ url: server.url, adminToken: "wrong" }).limits.list(), Unauthorized);
});

// ---- permits --------------------------------------------------------------------------------

test("the admin token a local server keeps is found for that server alone", async () => {
  const state = mkdtempSync(join(tmpdir(), "tollgate-ts-state-"));
  const kept = await Server.start([], { TOLLGATE_ADMIN_TOKEN: undefined, XDG_STATE_HOME: state });
  try {
    process.env["XDG_STATE_HOME"] = state;
    const tollgate = new Client({ url: kept.url });
    await tollgate.limits.put("kept-token", { kind: "rate", limit: 1, period_ms: 1000 });
    assert.equal((await tollgate.limits.get("kept-token")).limit, 1);
    // Another user's state directory holds no token for it.
    process.env["XDG_STATE_HOME"] = join(state, "elsewhere");
    await assert.rejects(new Client({ url: kept.url }).limits.list(), Unauthorized);
  } finally {
    process.env["XDG_STATE_HOME"] = isolatedState;
    await kept.stop();
  }
});

test("acquire grants a permit with the limits' state, and commit refunds what was not used", async () => {
  const name = await rate(5);
  const permit = await client.acquire(name, { cost: 2 });
  assert.match(permit.id, /^[0-9a-f]+$/);
  assert.equal(permit.cost, 2);
  assert.equal(permit.fence, undefined);
  const [status] = permit.limits;
  assert.equal(status?.name, name);
  assert.equal(status?.remaining, 3);
  assert.ok(status.resetAfter > 0 && status.resetAfter <= 60, `${status.resetAfter}`);
  assert.equal(status.expiresAfter, undefined);
  assert.deepEqual(await permit.commit(1), { refunded: 1, released: 0 });
  assert.ok(permit.settled);
  await assert.rejects(permit.commit(1), Conflict, "once per permit");
  assert.equal(await remaining(name), 4);
});

test("acquire takes every limit or none", async () => {
  const roomy = await rate(5);
  const full = await rate(1);
  await client.acquire(full);
  await assert.rejects(client.acquire([roomy, full]), RateLimited);
  assert.equal((await client.acquire(roomy, { cost: 5 })).limits[0]?.remaining, 0, "nothing was taken");
});

test("a denial is RateLimited with its reason, retryAfter in seconds and the limits", async () => {
  const name = await rate(1);
  await client.acquire(name);
  const denial = await client.acquire(name).catch((caught: unknown) => caught);
  assert.ok(denial instanceof RateLimited && denial instanceof TollgateError);
  assert.equal(denial.code, "rate_limited");
  assert.equal(denial.status, 429);
  assert.equal(denial.field, null);
  assert.equal(denial.reason, "capacity");
  assert.ok(denial.retryAfter > 0 && denial.retryAfter <= 60, `${denial.retryAfter}`);
  assert.deepEqual(
    denial.limits.map((status) => [status.name, status.remaining]),
    [[name, 0]],
  );
  assert.equal(await client.tryAcquire(name), null);
});

test("a waiting acquire is granted when room appears", async () => {
  const slots = await concurrency(1);
  const held = await client.acquire(slots);
  const waiting = client.acquire(slots, { wait: 30 });
  setTimeout(() => void held.release(), 200);
  const granted = await waiting;
  assert.ok(granted.fence! > held.fence!, "a new lease, with a greater fence");
  await granted.release();
});

test("key selects a counter, and priority reaches the reserve", async () => {
  const perAccount = await rate(1, { per: "account" });
  await client.acquire(perAccount, { key: "a1" });
  assert.equal(await client.tryAcquire(perAccount, { key: "a1" }), null);
  assert.notEqual(await client.tryAcquire(perAccount, { key: "a2" }), null);
  const reserved = await rate(2, { reserve: { high: 1 } });
  await client.acquire(reserved, { priority: "low" });
  assert.equal(await client.tryAcquire(reserved, { priority: "low" }), null);
  assert.notEqual(await client.tryAcquire(reserved, { priority: "high" }), null);
});

test("bad requests name the field the server refused", async () => {
  const name = await rate(5);
  const priority = await client.acquire(name, { priority: "urgent" as never }).catch((caught: unknown) => caught);
  assert.ok(priority instanceof BadRequest);
  assert.equal(priority.field, "priority");
  const cost = await client.acquire(name, { cost: 0 }).catch((caught: unknown) => caught);
  assert.ok(cost instanceof BadRequest);
  assert.equal(cost.field, "cost");
  const used = await (await client.acquire(name)).commit(2).catch((caught: unknown) => caught);
  assert.ok(used instanceof BadRequest);
  assert.equal(used.field, "used");
  await assert.rejects(client.acquire(unique("missing")), NotFound);
});

test("await using commits all of cost, or what used says", async () => {
  const name = await rate(10);
  {
    await using permit = await client.acquire(name, { cost: 3 });
    assert.ok(!permit.settled);
  }
  assert.equal(await remaining(name), 7);
  {
    await using permit = await client.acquire(name, { cost: 3 });
    permit.used = 1;
  }
  assert.equal(await remaining(name), 6, "two of the three were refunded");
  {
    await using permit = await client.acquire(name, { cost: 2 });
    await permit.commit(0);
  }
  assert.equal(await remaining(name), 6, "leaving after an explicit commit does nothing more");
});

test("await using on a throw refunds nothing and releases a lease", async () => {
  const name = await rate(10);
  const slots = await concurrency(1);
  await assert.rejects(async () => {
    await using permit = await client.acquire([name, slots], { cost: 1 });
    assert.ok(permit.fence !== undefined);
    throw new Error("the call failed");
  }, /the call failed/);
  assert.equal(await remaining(name), 9, "the unit stays spent: the call may have happened");
  const again = await client.acquire(slots);
  await again.release();
});

test("limited commits used on a result, nothing on a throw, and releases a lease either way", async () => {
  const name = await rate(10);
  const send = client.limited(name, { cost: 4 }, async (permit, items: string[]) => {
    if (items.length === 0) {
      permit.used = 3;
      throw new Error("nothing to send");
    }
    permit.used = items.length;
    return items.length;
  });
  assert.equal(await send(["a"]), 1);
  assert.equal(await remaining(name), 9, "three of the four were refunded");
  await assert.rejects(send([]), /nothing to send/);
  assert.equal(await remaining(name), 5, "a throw refunds nothing, whatever used said");

  const slots = await concurrency(1);
  const hold = client.limited(slots, {}, async (_permit, fail: boolean) => {
    assert.equal(await client.tryAcquire(slots), null, "the lease is held while it runs");
    if (fail) {
      throw new Error("failed");
    }
  });
  await hold(false);
  await assert.rejects(hold(true), /failed/);
  await (await client.acquire(slots)).release();

  const full = await rate(1);
  await client.acquire(full);
  let ran = false;
  const never = client.limited(full, {}, () => {
    ran = true;
  });
  await assert.rejects(never(), RateLimited);
  assert.ok(!ran, "nothing runs without a permit");
});

test("leases carry fences, renew and release; a rate permit cannot be renewed", async () => {
  const slots = await concurrency(1);
  const lease = await client.acquire(slots);
  assert.ok(lease.fence !== undefined);
  assert.ok(lease.limits[0]!.expiresAfter! > 0);
  const expiresAfter = await lease.renew();
  assert.ok(expiresAfter > 50 && expiresAfter <= 60, `${expiresAfter}`);
  assert.deepEqual(await lease.release(), { refunded: 0, released: 1 });
  await assert.rejects(lease.renew(), Conflict);
  const ratePermit = await client.acquire(await rate(1));
  await assert.rejects(ratePermit.renew(), Conflict);
});

test("a forged permit is not found", async () => {
  const permit = await client.acquire(await rate(1));
  const forged = `${permit.id.slice(0, -2)}${permit.id.endsWith("00") ? "11" : "00"}`;
  const stranger = await client.acquire(await rate(1));
  Object.defineProperty(stranger, "id", { value: forged });
  await assert.rejects(stranger.commit(), NotFound);
});

// ---- pauses ---------------------------------------------------------------------------------

// ---- costs per limit, commits by limit, charges ----------------------------------------------

/** Requests (10), input tokens (1,000) and output tokens (500) per period. */
async function modelLimits(fields: Record<string, unknown> = {}): Promise<[string, string, string]> {
  return [await rate(10, fields), await rate(1_000, fields), await rate(500, fields)];
}

test("costs per limit are one decision, all or none", async () => {
  const [rpm, itpm, otpm] = await modelLimits();
  const permit = await client.acquire([rpm, itpm, otpm], { costs: { [itpm]: 600, [otpm]: 400 } });
  assert.deepEqual(
    permit.limits.map((status) => status.remaining),
    [9, 400, 100],
  );
  assert.deepEqual([permit.cost, permit.costs], [1, { [itpm]: 600, [otpm]: 400 }]);
  // Room for the request and its input, not its output: nothing is taken.
  await assert.rejects(client.acquire([rpm, itpm, otpm], { costs: { [itpm]: 100, [otpm]: 101 } }), RateLimited);
  const fits = await client.acquire([rpm, itpm, otpm], { costs: { [itpm]: 400, [otpm]: 100 } });
  assert.deepEqual(
    fits.limits.map((status) => status.remaining),
    [8, 0, 0],
  );
});

test("a commit by limit refunds each limit's own, and a permit with costs keeps all it holds", async () => {
  const [rpm, itpm, otpm] = await modelLimits();
  const permit = await client.acquire([rpm, itpm, otpm], { costs: { [itpm]: 600, [otpm]: 400 } });
  const committed = await permit.commit({ [rpm]: 1, [itpm]: 250, [otpm]: 380 });
  assert.deepEqual(committed, { refunded: 350 + 20, released: 0 });
  assert.equal(await client.tryAcquire([itpm, otpm], { costs: { [itpm]: 751, [otpm]: 1 } }), null);
  assert.equal(await client.tryAcquire([itpm, otpm], { costs: { [itpm]: 1, [otpm]: 121 } }), null);
  // Disposed with a lease: each rate limit keeps all it granted, the lease is released unnamed.
  const lease = await concurrency(1);
  {
    await using held = await client.acquire([rpm, itpm, lease], { costs: { [itpm]: 700 } });
    assert.notEqual(held.fence, undefined);
  }
  assert.equal(await client.tryAcquire(itpm, { cost: 51 }), null);
  assert.notEqual(await client.tryAcquire(lease), null);
});

test("a charge past the limit makes the next acquire wait", async () => {
  const [, , otpm] = await modelLimits({ period_ms: 1000, algorithm: "fixed" });
  await (await client.acquire(otpm, { cost: 400 })).commit(380);
  // The answer ran 300 past its grant: counted at once, past the limit.
  const [view] = await client.charge([otpm], { cost: 300 });
  const chargedAt = performance.now() / 1000;
  assert.deepEqual([view!.name, view!.charged, view!.used], [otpm, 300, 680]);
  assert.ok(view!.resetAfter > 0 && view!.resetAfter <= 1, String(view!.resetAfter));
  assert.equal(await client.tryAcquire(otpm, { priority: "high" }), null);
  const later = await client.acquire(otpm, { wait: 5 });
  // Safety, not speed: granted no sooner than the counted debt stopped counting (10 ms for
  // rounding).
  assert.ok(performance.now() / 1000 - chargedAt >= view!.resetAfter - 0.01);
  await later.commit();
  // At most one capacity past the limit; a limit not in costs is charged cost (1).
  const [, minuteInput, minuteOutput] = await modelLimits();
  await (await client.acquire(minuteOutput, { cost: 400 })).commit(380);
  const views = await client.charge([minuteOutput, minuteInput], { costs: { [minuteOutput]: 5000 } });
  assert.deepEqual(
    views.map((each) => [each.name, each.charged, each.used]),
    [
      [minuteOutput, 1000 - 380, 1000],
      [minuteInput, 1, 1],
    ],
  );
});

test("costs, commits and charges name bad input", async () => {
  const [rpm, itpm, otpm] = await modelLimits();
  const lease = await concurrency(1);
  const refused = async (work: Promise<unknown>, field: string): Promise<void> => {
    await assert.rejects(work, (error: unknown) => error instanceof BadRequest && error.field === field);
  };
  await refused(client.acquire([rpm], { costs: { [itpm]: 5 } }), `costs.${itpm}`);
  await refused(client.acquire([rpm], { costs: { [rpm]: 0 } }), `costs.${rpm}`);
  const permit = await client.acquire([rpm, itpm, otpm], { costs: { [itpm]: 600, [otpm]: 400 } });
  await refused(permit.commit({ [rpm]: 1, [itpm]: 100 }), "used");
  await refused(permit.commit({ [rpm]: 1, [itpm]: 100, [otpm]: 50, [lease]: 1 }), "used");
  assert.equal((await permit.commit({ [rpm]: 1, [itpm]: 600, [otpm]: 400 })).refunded, 0);
  await refused(client.charge([lease]), "limits");
  await refused(client.charge([otpm], { cost: 0 }), "cost");
  await refused(client.charge([otpm], { costs: { [itpm]: 5 } }), `costs.${itpm}`);
  await assert.rejects(client.charge([unique("missing")]), NotFound);
  await assert.rejects(client.charge([otpm], { costs: [1] as unknown as Record<string, number> }), /^TypeError: costs: /);
});

test("a pause stops grants and only extends", async () => {
  const name = await rate(100);
  assert.ok((await client.pause(name, { seconds: 30 })) >= 29);
  assert.ok((await client.pause(name, { seconds: 1 })) > 25, "a shorter pause does not shorten it");
  const denial = await client.acquire(name).catch((caught: unknown) => caught);
  assert.ok(denial instanceof RateLimited);
  assert.equal(denial.reason, "paused");
  assert.ok(denial.retryAfter > 25);
});

test("a pause of one key, and pause errors", async () => {
  const name = await rate(100, { per: "account" });
  await client.pause(name, { seconds: 30, key: "a1" });
  assert.equal(await client.tryAcquire(name, { key: "a1" }), null);
  assert.notEqual(await client.tryAcquire(name, { key: "a2" }), null);
  await assert.rejects(client.pause(unique("missing"), { seconds: 1 }), NotFound);
  const keyed = await client.pause(await rate(1), { seconds: 1, key: "k" }).catch((caught: unknown) => caught);
  assert.ok(keyed instanceof BadRequest);
  assert.equal(keyed.field, "key");
  const zero = await client.pause(await rate(1), { seconds: 0 }).catch((caught: unknown) => caught);
  assert.ok(zero instanceof BadRequest);
  assert.equal(zero.field, "retry_after_ms");
});

// ---- check ----------------------------------------------------------------------------------

test("check allows, then denies without rejecting", async () => {
  const prefix = unique("api");
  const name = unique();
  await client.limits.put(name, {
    kind: "rate",
    limit: 1,
    period_ms: MINUTE_MS,
    per: "user",
    match: { method: "GET", path: `/${prefix}/entity/#/bundle` },
  });
  const first = await client.check({ user: "u1", method: "GET", path: `/${prefix}/entity/123/bundle` });
  assert.equal(first.allowed, true);
  assert.equal(first.path, `/${prefix}/entity/#/bundle`);
  assert.deepEqual(first.matched, [name]);
  assert.equal(first.permit, undefined);
  assert.equal(first.retryAfter, undefined);
  const second = await client.check({ user: "u1", method: "GET", path: `/${prefix}/entity/456/bundle` });
  assert.equal(second.allowed, false);
  assert.ok(second.retryAfter! > 0);
  assert.equal(second.reason, "capacity");
  assert.deepEqual(second.matched, [name]);
  assert.equal((await client.check({ user: "u2", method: "GET", path: `/${prefix}/entity/1/bundle` })).allowed, true);
  const unmatched = await client.check({ user: "u1", method: "GET", path: `/${prefix}/other` });
  assert.equal(unmatched.allowed, true);
  assert.deepEqual(unmatched.matched, []);
  const method = await client.check({ user: "u1", method: "G E T", path: "/x" }).catch((caught: unknown) => caught);
  assert.ok(method instanceof BadRequest);
  assert.equal(method.field, "method");
});

test("check hands back a lease when a concurrency limit applied", async () => {
  const prefix = unique("api");
  const name = unique();
  await client.limits.put(name, {
    kind: "concurrency",
    limit: 1,
    lease_ttl_ms: MINUTE_MS,
    per: "user",
    match: { method: "*", path: `/${prefix}/export` },
  });
  const result = await client.check({ user: "u1", method: "POST", path: `/${prefix}/export` });
  assert.equal(result.allowed, true);
  assert.ok(result.permit !== undefined);
  {
    await using permit = result.permit;
    assert.equal((await client.check({ user: "u1", method: "POST", path: `/${prefix}/export` })).allowed, false);
    assert.ok(permit.fence !== undefined);
  }
  const again = await client.check({ user: "u1", method: "POST", path: `/${prefix}/export` });
  assert.equal(again.allowed, true, "the lease was released");
  await again.permit?.commit();
});

// ---- servers of their own -------------------------------------------------------------------

test("data and admin tokens", async () => {
  const guarded = await Server.start([], { TOLLGATE_DATA_TOKEN: "data-token" });
  try {
    const both = new Client({ url: guarded.url, token: "data-token", adminToken: ADMIN_TOKEN });
    const name = unique();
    await both.limits.put(name, { kind: "rate", limit: 5, period_ms: 1000 });
    await (await both.acquire(name)).commit();
    const noDataToken = new Client({ url: guarded.url, adminToken: ADMIN_TOKEN });
    await assert.rejects(noDataToken.acquire(name), Unauthorized);
    await noDataToken.limits.get(name);
    await assert.rejects(new Client({ url: guarded.url, token: "data-token" }).limits.get(name), Unauthorized);
  } finally {
    await guarded.stop();
  }
});

test("the server and the data token come from the environment", async () => {
  // As the README's quick start meets it: a server that keeps its admin token for this user,
  // a data token set, and a client made with no options.
  const state = mkdtempSync(join(tmpdir(), "tollgate-ts-state-"));
  const guarded = await Server.start([], {
    TOLLGATE_ADMIN_TOKEN: undefined,
    TOLLGATE_DATA_TOKEN: "data-token",
    XDG_STATE_HOME: state,
  });
  try {
    process.env["XDG_STATE_HOME"] = state;
    process.env["TOLLGATE_SERVER"] = `${guarded.url}/`;
    process.env["TOLLGATE_DATA_TOKEN"] = "data-token";
    const tollgate = new Client();
    assert.equal(tollgate.url, guarded.url);
    const name = unique();
    // The admin call sends the kept admin token, not the data token.
    await tollgate.limits.put(name, { kind: "rate", limit: 5, period_ms: 1000 });
    await (await tollgate.acquire(name)).commit();
    // A token given wins over the environment's, and so does a URL given.
    await assert.rejects(new Client({ token: "wrong" }).acquire(name), Unauthorized);
    process.env["TOLLGATE_SERVER"] = "http://127.0.0.1:1";
    await (await new Client({ url: guarded.url }).acquire(name)).commit();
    delete process.env["TOLLGATE_SERVER"];
    delete process.env["TOLLGATE_DATA_TOKEN"];
    assert.equal(new Client().url, "http://127.0.0.1:7070");
    await assert.rejects(new Client({ url: guarded.url }).acquire(name), Unauthorized);
  } finally {
    delete process.env["TOLLGATE_SERVER"];
    delete process.env["TOLLGATE_DATA_TOKEN"];
    process.env["XDG_STATE_HOME"] = isolatedState;
    await guarded.stop();
  }
});

test("too many keys", async () => {
  const small = await Server.start(["--keys-tracked-max", "3"]);
  try {
    const tollgate = new Client({ url: small.url, token: ADMIN_TOKEN });
    const name = unique();
    await tollgate.limits.put(name, { kind: "rate", limit: 5, period_ms: MINUTE_MS, per: "user" });
    const error = await (async () => {
      for (let index = 0; index < 10; index += 1) {
        await tollgate.acquire(name, { key: `user-${index}` });
      }
    })().catch((caught: unknown) => caught);
    assert.ok(error instanceof TooManyKeys);
    assert.equal(error.code, "too_many_keys");
    assert.equal(error.status, 503);
  } finally {
    await small.stop();
  }
});

test("store_unavailable when the server stops under a waiting acquire", async () => {
  const stopping = await Server.start();
  const tollgate = new Client({ url: stopping.url, token: ADMIN_TOKEN });
  const name = unique();
  await tollgate.limits.put(name, { kind: "concurrency", limit: 1, lease_ttl_ms: MINUTE_MS });
  await tollgate.acquire(name);
  const waiting = tollgate.acquire(name, { wait: 60 }).catch((caught: unknown) => caught);
  // Stop once the acquire waits at the server (its gauge shows it).
  const deadline = Date.now() + 30_000;
  for (;;) {
    const metrics = await (await fetch(`${stopping.url}/metrics`)).text();
    if (metrics.includes(`tollgate_waiters{limit="${name}"} 1`)) {
      break;
    }
    assert.ok(Date.now() < deadline, "the acquire never waited at the server");
    await new Promise((wake) => setTimeout(wake, 50));
  }
  await stopping.stop();
  const error = await waiting;
  assert.ok(error instanceof StoreUnavailable, String(error));
  assert.equal(error.code, "store_unavailable");
  assert.equal(error.status, 503);
});

test("an unreachable server", async () => {
  const port = await new Promise<number>((resolve) => {
    const probe = createServer();
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      probe.close(() => resolve(typeof address === "object" && address !== null ? address.port : 0));
    });
  });
  const error = await new Client({ url: `http://127.0.0.1:${port}`, timeout: 5 })
    .acquire("anything")
    .catch((caught: unknown) => caught);
  assert.ok(error instanceof ServerUnreachable);
  assert.equal(error.code, "unreachable");
  assert.equal(error.status, null);
  assert.ok(error.cause !== undefined);
});
