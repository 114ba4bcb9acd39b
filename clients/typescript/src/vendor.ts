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

// ---- structured fields (the part of RFC 8941 the ratelimit headers use) --------------------

/** One list member: its name and its parameters (raw values, the last of a repeated key). */
interface Member {
  name: string;
  parameters: Map<string, string>;
}

const TOKEN = /^[A-Za-z*][A-Za-z0-9!#$%&'*+\-.^_`|~:/]*$/;
/** Milliseconds above this are unreadable: no integer type of any implementation loses them. */
const MS_MAX = 2 ** 53;

/** `text` split at `separator` outside quoted strings; `null` if a quoted string is unterminated. */
function splitOutsideQuotes(text: string, separator: string): string[] | null {
  const parts: string[] = [];
  let current = "";
  let quoted = false;
  for (let index = 0; index < text.length; index += 1) {
    const char = text[index]!;
    if (quoted) {
      current += char;
      if (char === "\\" && index + 1 < text.length) {
        index += 1;
        current += text[index];
      } else if (char === '"') {
        quoted = false;
      }
    } else if (char === '"') {
      quoted = true;
      current += char;
    } else if (char === separator) {
      parts.push(current);
      current = "";
    } else {
      current += char;
    }
  }
  if (quoted) {
    return null;
  }
  parts.push(current);
  return parts;
}

function trim(text: string): string {
  return text.replace(/^[ \t]+|[ \t]+$/g, "");
}

/** The content of a quoted string (printable ASCII, `\\` and `\"` escapes only), or `null`. */
function quotedString(text: string): string | null {
  if (text.length < 2 || !text.startsWith('"') || !text.endsWith('"')) {
    return null;
  }
  let out = "";
  for (let index = 1; index < text.length - 1; index += 1) {
    const char = text[index]!;
    if (char === "\\") {
      const next = text[index + 1];
      if ((next !== '"' && next !== "\\") || index + 1 >= text.length - 1) {
        return null;
      }
      out += next;
      index += 1;
    } else if (char === '"' || char < " " || char > "~") {
      return null;
    } else {
      out += char;
    }
  }
  return out;
}

/** A quoted string's content or a token; `null` if it is neither. */
function stringOrToken(text: string): string | null {
  return TOKEN.test(text) ? text : quotedString(text);
}

/** The members of a list field; `null` if it cannot be read. Members without a name are skipped. */
function members(text: string | null): Member[] | null {
  if (text === null) {
    return null;
  }
  const raw = splitOutsideQuotes(text, ",");
  if (raw === null) {
    return null;
  }
  const out: Member[] = [];
  for (const member of raw) {
    if (trim(member) === "") {
      continue;
    }
    const [head = "", ...rest] = splitOutsideQuotes(member, ";") ?? [];
    const name = stringOrToken(trim(head));
    if (name === null) {
      continue;
    }
    const parameters = new Map<string, string>();
    for (const parameter of rest) {
      const equals = parameter.indexOf("=");
      if (equals >= 0) {
        parameters.set(trim(parameter.slice(0, equals)), trim(parameter.slice(equals + 1)));
      }
    }
    out.push({ name, parameters });
  }
  return out;
}

/** An int parameter: `undefined` when absent, `null` when present but not an int. */
function intParameter(member: Member, key: string): number | null | undefined {
  const raw = member.parameters.get(key);
  return raw === undefined ? undefined : int(raw);
}

/** Seconds as milliseconds; `null` beyond {@link MS_MAX}. */
function secondsMs(seconds: number | null | undefined): number | null {
  return typeof seconds === "number" && seconds * 1000 <= MS_MAX ? seconds * 1000 : null;
}

function ietf(policy: string | null, state: string | null): Omit<Advice, "family"> {
  const quotas: AdvisedQuota[] = [];
  for (const member of members(policy) ?? []) {
    const unit = member.parameters.get("qu");
    if (unit !== undefined && stringOrToken(unit) !== "requests") {
      continue;
    }
    const quota = intParameter(member, "q");
    const window = intParameter(member, "w");
    const windowMs = secondsMs(window);
    if (typeof quota !== "number" || (window !== undefined && (windowMs === null || windowMs < 1))) {
      continue;
    }
    quotas.push({ quota, windowMs });
  }
  let remaining: number | null = null;
  let leastReset: number | null = null;
  let exhausted = false;
  let exhaustedReset: number | null = null;
  for (const member of members(state) ?? []) {
    const left = intParameter(member, "r");
    const reset = secondsMs(intParameter(member, "t"));
    if (typeof left === "number") {
      remaining = remaining === null ? left : Math.min(remaining, left);
    }
    if (reset !== null) {
      leastReset = leastReset === null ? reset : Math.min(leastReset, reset);
    }
    if (left === 0) {
      exhausted = true;
      if (reset !== null) {
        exhaustedReset = exhaustedReset === null ? reset : Math.max(exhaustedReset, reset);
      }
    }
  }
  // Nothing left: the wait is until the last exhausted window resets, never a guess.
  return { quotas: kept(quotas), remaining, resetMs: exhausted ? exhaustedReset : leastReset };
}

// ---- durations and dates ------------------------------------------------------------------

const DURATION_UNITS_MS: Record<string, bigint> = { h: 3_600_000n, m: 60_000n, s: 1000n, ms: 1n };
// A number is 1-16 digits, with 1-9 more after a point.
const DURATION_PART = /^([0-9]{1,16}(?:\.[0-9]{1,9})?)(ms|h|m|s)/;

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
  return rounded <= BigInt(MS_MAX) ? Number(rounded) : null;
}

const RFC3339 =
  /^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))$/;

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
  // Date.UTC reads years 0-99 as 1900-1999; setUTCFullYear takes them as given.
  const date = new Date(0);
  date.setUTCFullYear(y, mo, d);
  date.setUTCHours(h, mi, s, 0);
  const at = date.getTime();
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
      const at = secondsMs(int(text));
      return at === null ? null : Math.max(0, at - nowMs);
    }) ??
    simple("ietf-draft", ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"], (text) => {
      return secondsMs(int(text));
    })
  );
}
