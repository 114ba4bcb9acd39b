// The fetch wrapper's rules, without I/O: reading Retry-After and classifying answers on the
// vectors every implementation shares, bounding pauses and backoffs, and refusing
// configurations out of range naming the option.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { defaultVerdict, parseRetryAfter, Verdict } from "../src/index.js";
import { Policy, type PolicyOptions } from "../src/dispatch.js";
import { vectors } from "./support.js";

const VECTORS = vectors();

/** A header value as fetch's Headers hands it over: each byte one character (Latin-1). */
function headerValue(case_: { value?: string; hex?: string }): string {
  if (case_.hex !== undefined) {
    return Buffer.from(case_.hex, "hex").toString("latin1");
  }
  return case_.value!;
}

describe("the shared Retry-After vectors", () => {
  assert.ok(VECTORS.retry_after.length > 20, "the vectors were read");
  for (const case_ of VECTORS.retry_after) {
    test(JSON.stringify(case_), () => {
      const read = parseRetryAfter(headerValue(case_), VECTORS.now);
      if (case_.saturates) {
        assert.ok(read !== null && read >= 2 ** 53, `read ${read}`);
      } else {
        assert.equal(read, case_.seconds);
      }
    });
  }
});

describe("the shared verdict vectors", () => {
  for (const case_ of VECTORS.verdicts) {
    test(JSON.stringify(case_), () => {
      const headers = new Headers(case_.retry_after === undefined ? {} : { "retry-after": case_.retry_after });
      const expected =
        case_.verdict === "rate_limited"
          ? Verdict.rateLimited(case_.seconds ?? null)
          : case_.verdict === "retry"
            ? Verdict.retry()
            : Verdict.done();
      assert.deepEqual(defaultVerdict(case_.status, headers, VECTORS.now), expected);
    });
  }
});

test("two-digit years are never more than 50 years ahead", () => {
  const now = Date.UTC(2026, 0, 1) / 1000;
  const in2030 = parseRetryAfter("Tuesday, 01-Jan-30 00:00:00 GMT", now);
  assert.ok(in2030 !== null && in2030 > 3 * 365 * 86400 && in2030 < 5 * 365 * 86400, `${in2030}`);
  assert.equal(parseRetryAfter("Monday, 01-Jan-90 00:00:00 GMT", now), 0, "1990, in the past");
});

function policy(overrides: Partial<PolicyOptions> = {}): Policy {
  return new Policy({ hosts: { "api.vendor.example": "vendor-x" }, ...overrides });
}

test("pauses are at least the vendor's wait, capped, and none for Retry-After: 0", () => {
  const rules = policy();
  for (let round = 0; round < 200; round += 1) {
    const pause = rules.pauseFor(15)!;
    assert.ok(pause >= 15 && pause <= 15.25, `${pause}`);
    const fallback = rules.pauseFor(null)!;
    assert.ok(fallback >= 30 && fallback <= 30.25, `${fallback}`);
    const huge = rules.pauseFor(2 ** 63)!;
    assert.ok(huge >= 900 && huge <= 900.25, `${huge}`);
  }
  assert.equal(rules.pauseFor(0), null, "Retry-After: 0 asks for no pause");
});

test("backoff doubles within bounds", () => {
  const rules = policy();
  for (let attempt = 0; attempt < 20; attempt += 1) {
    const full = Math.min(0.1 * 2 ** attempt, 5);
    for (let draw = 0; draw < 20; draw += 1) {
      const backoff = rules.backoff(attempt);
      assert.ok(backoff >= full / 2 && backoff <= full, `${attempt}: ${backoff}`);
    }
  }
});

test("hosts match with the port first, without case", () => {
  const rules = new Policy({ hosts: { "API.vendor.example": "any-port", "api.vendor.example:8443": ["one", "two"] } });
  const specific = rules.hostFor(new URL("https://api.vendor.example:8443/x"))!;
  assert.deepEqual(specific.names, ["one", "two"]);
  assert.equal(specific.pauseTarget, "one");
  assert.deepEqual(rules.hostFor(new URL("https://API.Vendor.Example/x"))?.names, ["any-port"]);
  assert.deepEqual(rules.hostFor(new URL("https://api.vendor.example:443/x"))?.names, ["any-port"]);
  assert.equal(rules.hostFor(new URL("https://elsewhere.example/")), undefined);
});

describe("a configuration out of range is refused naming the option", () => {
  const cases: [Partial<PolicyOptions> | { hosts: object }, string][] = [
    [{ priority: "urgent" as never }, "priority"],
    [{ hosts: {} }, "hosts"],
    [{ hosts: { "api.vendor.example": [] } }, "limits"],
    [{ waitMax: 0 }, "waitMax"],
    [{ waitMax: Number.NaN }, "waitMax"],
    [{ retriesMax: 101 }, "retriesMax"],
    [{ retriesMax: -1 }, "retriesMax"],
    [{ retriesMax: 1.5 }, "retriesMax"],
    [{ backoff: 6 }, "backoff"],
    [{ retryAfterDefault: 0 }, "retryAfterDefault"],
    [{ retryAfterDefault: 1000 }, "retryAfterDefault"],
    [{ retryAfterMax: 86400 }, "retryAfterMax"],
    [{ resumeJitterMax: -1 }, "resumeJitterMax"],
  ];
  for (const [overrides, option] of cases) {
    test(`${JSON.stringify(overrides)} names ${option}`, () => {
      assert.throws(() => policy(overrides as Partial<PolicyOptions>), (error: Error) => error.message.startsWith(`${option}:`));
    });
  }
});
