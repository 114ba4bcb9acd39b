/**
 * Reading a vendor's rate-limit headers ("advice"), free of I/O: the quotas a vendor
 * advertises, the calls it has left and when its window resets, from whichever of the five
 * common header families its answer carries.
 *
 * The families, the first with any of its fields present winning:
 *
 * 1. `ietf`: `RateLimit-Policy: "name";q=10;w=1` and `RateLimit: "name";r=0;t=1`
 *    (structured fields; a policy whose `qu` is not `"requests"` is ignored);
 * 2. `openai`: `x-ratelimit-{limit,remaining,reset}-requests`, the reset a Go duration;
 * 3. `anthropic`: `anthropic-ratelimit-requests-{limit,remaining,reset}`, the reset an
 *    RFC 3339 date-time;
 * 4. `github`: `x-ratelimit-{limit,remaining,reset}`, the reset in epoch seconds;
 * 5. `ietf-draft`: `RateLimit-{Limit,Remaining,Reset}`, the reset in delta seconds.
 *
 * A value that cannot be read, or longer than {@link ADVICE_VALUE_BYTES_MAX}, makes its field
 * `null`: never an error, never a guess. The same rules as tollgate-dispatch's and the Python
 * client's, held to the same test vectors (`crates/dispatch/tests/vectors/vendor_headers.json`).
 */

/** Longest header value read, in bytes. */
export const ADVICE_VALUE_BYTES_MAX = 256;
/** Most quotas kept from one answer (the first ones). */
export const ADVICE_QUOTAS_MAX = 8;

/** The header family an advice was read from. */
export type AdviceFamily = "ietf" | "openai" | "anthropic" | "github" | "ietf-draft";

/** One quota a vendor advertises: `quota` calls per `windowMs` (`null`: not said). */
export interface AdvisedQuota {
  readonly quota: number;
  readonly windowMs: number | null;
}

/** What a vendor's answer says of its limits; times in milliseconds. */
export interface Advice {
  readonly family: AdviceFamily;
  readonly quotas: readonly AdvisedQuota[];
  /** Calls left in the vendor's window after this one. */
  readonly remaining: number | null;
  /** Milliseconds from now until the vendor's window resets (or a unit comes back). */
  readonly resetMs: number | null;
}

const INT = /^[0-9]{1,16}$/;

/** A header's value trimmed of spaces and tabs; `null` when absent or too long. */
function value(headers: Headers, name: string): string | null {
  const raw = headers.get(name);
  if (raw === null || raw.length > ADVICE_VALUE_BYTES_MAX) {
    return null;
  }
  return raw.replace(/^[ \t]+|[ \t]+$/g, "");
}

/** An int: 1-16 ASCII digits, nothing else. */
function int(text: string | null): number | null {
  return text !== null && INT.test(text) ? Number(text) : null;
}

/** The quotas kept: none of 0, the first {@link ADVICE_QUOTAS_MAX}. */
function kept(quotas: AdvisedQuota[]): AdvisedQuota[] {
  return quotas.filter((item) => item.quota > 0).slice(0, ADVICE_QUOTAS_MAX);
}

// ---- structured fields (RFC 8941, the part the ratelimit headers use) ----------------------

type Parameter = { kind: "int"; value: number } | { kind: "string"; value: string } | { kind: "other" };

interface Item {
  name: string;
  parameters: Map<string, Parameter>;
}

const TOKEN = /^[A-Za-z*][A-Za-z0-9!#$%&'*+\-.^_`|~:/]*/;
const KEY = /^[a-z*][a-z0-9_\-.*]*/;
const BARE_VALUE = /^[^;,"]+/;

/** A list of items with parameters; `null` if it cannot be read. */
function structuredList(text: string): Item[] | null {
  const items: Item[] = [];
  let rest = text;
  const skip = (): void => {
    rest = rest.replace(/^[ \t]+/, "");
  };
  /** A quoted string at the start of `rest`, unescaped; `null` if there is none. */
  const quoted = (): string | null => {
    if (!rest.startsWith('"')) {
      return null;
    }
    let out = "";
    for (let index = 1; index < rest.length; index += 1) {
      const char = rest[index]!;
      if (char === "\\") {
        const next = rest[index + 1];
        if (next !== '"' && next !== "\\") {
          return null;
        }
        out += next;
        index += 1;
      } else if (char === '"') {
        rest = rest.slice(index + 1);
        return out;
      } else if (char < " " || char > "~") {
        return null;
      } else {
        out += char;
      }
    }
    return null;
  };
  for (;;) {
    skip();
    let name: string | null;
    if (rest.startsWith('"')) {
      name = quoted();
    } else {
      const token = TOKEN.exec(rest);
      name = token === null ? null : token[0];
      if (token !== null) {
        rest = rest.slice(token[0].length);
      }
    }
    if (name === null) {
      return null;
    }
    const parameters = new Map<string, Parameter>();
    for (;;) {
      skip();
      if (!rest.startsWith(";")) {
        break;
      }
      rest = rest.slice(1);
      skip();
      const key = KEY.exec(rest);
      if (key === null) {
        return null;
      }
      rest = rest.slice(key[0].length);
      let parameter: Parameter = { kind: "other" };
      if (rest.startsWith("=")) {
        rest = rest.slice(1);
        if (rest.startsWith('"')) {
          const text = quoted();
          if (text === null) {
            return null;
          }
          parameter = { kind: "string", value: text };
        } else {
          const bare = BARE_VALUE.exec(rest);
          if (bare === null) {
            return null;
          }
          rest = rest.slice(bare[0].length);
          const word = bare[0].replace(/[ \t]+$/, "");
          if (/[ \t]/.test(word)) {
            return null;
          }
          const number = int(word);
          parameter = number === null ? { kind: "other" } : { kind: "int", value: number };
        }
      }
      parameters.set(key[0], parameter);
    }
    items.push({ name, parameters });
    skip();
    if (rest === "") {
      return items;
    }
    if (!rest.startsWith(",")) {
      return null;
    }
    rest = rest.slice(1);
  }
}

/** An int parameter: `undefined` when absent, `null` when present but not an int. */
function intParameter(item: Item, key: string): number | null | undefined {
  const parameter = item.parameters.get(key);
  if (parameter === undefined) {
    return undefined;
  }
  return parameter.kind === "int" ? parameter.value : null;
}

function ietf(policy: string | null, state: string | null): Omit<Advice, "family"> {
  const quotas: AdvisedQuota[] = [];
  const policies = policy === null ? null : structuredList(policy);
  for (const item of policies ?? []) {
    const unit = item.parameters.get("qu");
    if (unit !== undefined && !(unit.kind === "string" && unit.value === "requests")) {
      continue;
    }
    const quota = intParameter(item, "q");
    const window = intParameter(item, "w");
    if (quota === null || quota === undefined || window === null || window === 0) {
      continue;
    }
    quotas.push({ quota, windowMs: window === undefined ? null : window * 1000 });
  }
  let remaining: number | null = null;
  let resetMs: number | null = null;
  const states = state === null ? null : structuredList(state);
  if (states !== null) {
    let leastReset: number | null = null;
    let exhaustedReset: number | null = null;
    for (const item of states) {
      const left = intParameter(item, "r");
      const reset = intParameter(item, "t");
      if (typeof left === "number") {
        remaining = remaining === null ? left : Math.min(remaining, left);
      }
      if (typeof reset === "number") {
        const ms = reset * 1000;
        leastReset = leastReset === null ? ms : Math.min(leastReset, ms);
        if (left === 0) {
          exhaustedReset = exhaustedReset === null ? ms : Math.max(exhaustedReset, ms);
        }
      }
    }
    resetMs = exhaustedReset ?? leastReset;
  }
  return { quotas: kept(quotas), remaining, resetMs };
}

// ---- durations and dates ------------------------------------------------------------------

const DURATION_UNITS_MS: Record<string, bigint> = { h: 3_600_000n, m: 60_000n, s: 1000n, ms: 1n };
const DURATION_PART = /^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ms|h|m|s)/;

/** Milliseconds of a Go duration (`1h2m3.5s`, `20ms`, `0s`), rounded up; `null` if unreadable. */
export function goDurationMs(text: string): number | null {
  if (text === "") {
    return null;
  }
  // Exact: a sum of decimal fractions of whole milliseconds, over a common denominator.
  let numerator = 0n;
  let denominator = 1n;
  let rest = text;
  while (rest !== "") {
    const part = DURATION_PART.exec(rest);
    if (part === null) {
      return null;
    }
    rest = rest.slice(part[0].length);
    const [whole = "", fraction = ""] = part[1]!.split(".");
    const scale = 10n ** BigInt(fraction.length);
    const amount = BigInt(whole === "" ? "0" : whole) * scale + BigInt(fraction === "" ? "0" : fraction);
    const ms = amount * DURATION_UNITS_MS[part[2]!]!;
    // numerator/denominator + ms/scale
    numerator = numerator * scale + ms * denominator;
    denominator *= scale;
  }
  const rounded = (numerator + denominator - 1n) / denominator;
  return rounded <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(rounded) : null;
}

const RFC3339 =
  /^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))$/;

/** Epoch milliseconds of an RFC 3339 date-time, as a fraction-free ceiling; `null` if unreadable. */
export function rfc3339Ms(text: string): number | null {
  const match = RFC3339.exec(text);
  if (match === null) {
    return null;
  }
  const [, year, month, day, hour, minute, second, fraction = "", , sign, offsetHours, offsetMinutes] = match;
  const y = Number(year);
  const mo = Number(month) - 1;
  const d = Number(day);
  const h = Number(hour);
  const mi = Number(minute);
  const s = Number(second);
  if (h > 23 || mi > 59 || s > 59) {
    return null;
  }
  const at = Date.UTC(y, mo, d, h, mi, s);
  const date = new Date(at);
  // Date.UTC rolls 30 Feb over to March; such a date is malformed, not another day.
  if (date.getUTCFullYear() !== y || date.getUTCMonth() !== mo || date.getUTCDate() !== d) {
    return null;
  }
  let offsetMs = 0;
  if (sign !== undefined) {
    const oh = Number(offsetHours);
    const om = Number(offsetMinutes);
    if (oh > 23 || om > 59) {
      return null;
    }
    offsetMs = (sign === "+" ? 1 : -1) * (oh * 60 + om) * 60_000;
  }
  // A fraction of a millisecond counts as a whole one: a reset is never brought forward.
  const fractionMs = Number(fraction.padEnd(3, "0").slice(0, 3)) + (/[1-9]/.test(fraction.slice(3)) ? 1 : 0);
  return at - offsetMs + fractionMs;
}

// ---- the families -------------------------------------------------------------------------

/** The advice of the first family of `headers` with any field present, or `null`. */
export function readAdvice(headers: Headers, nowMs: number): Advice | null {
  const policy = headers.get("ratelimit-policy");
  const state = headers.get("ratelimit");
  if (policy !== null || state !== null) {
    return { family: "ietf", ...ietf(value(headers, "ratelimit-policy"), value(headers, "ratelimit")) };
  }
  const simple = (
    family: AdviceFamily,
    [limit, remaining, reset]: [string, string, string],
    resetMs: (text: string) => number | null,
  ): Advice | null => {
    if (!headers.has(limit) && !headers.has(remaining) && !headers.has(reset)) {
      return null;
    }
    const quota = int(value(headers, limit));
    const resetText = value(headers, reset);
    return {
      family,
      quotas: kept(quota === null ? [] : [{ quota, windowMs: null }]),
      remaining: int(value(headers, remaining)),
      resetMs: resetText === null ? null : resetMs(resetText),
    };
  };
  return (
    simple(
      "openai",
      ["x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"],
      goDurationMs,
    ) ??
    simple(
      "anthropic",
      ["anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"],
      (text) => {
        const at = rfc3339Ms(text);
        return at === null ? null : Math.max(0, Math.ceil(at - nowMs));
      },
    ) ??
    simple("github", ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"], (text) => {
      const at = int(text);
      return at === null ? null : Math.max(0, at * 1000 - nowMs);
    }) ??
    simple("ietf-draft", ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"], (text) => {
      const seconds = int(text);
      return seconds === null ? null : seconds * 1000;
    })
  );
}
