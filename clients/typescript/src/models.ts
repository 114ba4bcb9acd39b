/**
 * Values the server answers with, in the client's units (seconds as numbers, camelCase), and
 * the conversions to and from the wire's milliseconds. Free of I/O.
 */

import type { ChargedView, LimitView } from "./wire.js";

/** A request's priority: a lower level never delays a higher one. */
export type Priority = "high" | "normal" | "low";

/** One limit name, or several taken together (all or none). */
export type Limits = string | readonly string[];

/**
 * One limit's state after a decision.
 *
 * `remaining` is the units still open to the request's priority; `resetAfter` the seconds until
 * everything counted now stops counting. Leases also carry `fence` (a number that only grows
 * with each grant) and `expiresAfter` (seconds until the lease expires unless renewed).
 */
export interface LimitStatus {
  readonly name: string;
  readonly remaining: number;
  readonly resetAfter: number;
  readonly fence?: number;
  readonly expiresAfter?: number;
}

/**
 * Units by limit name: what an acquire takes of limits whose cost differs from `cost` (a model
 * call's input and output tokens beside its one request), what a commit says each rate limit
 * used, or what a charge counts.
 */
export type Costs = Readonly<Record<string, number>>;

/**
 * One limit after a charge ({@link Client.charge}). `charged` is the units counted: the charge,
 * less what would have put the limit more than one capacity past itself. `used` is the units
 * counted now, the charge among them (past the limit, later grants wait until it drains);
 * `resetAfter` the seconds until everything counted now stops counting.
 */
export interface Charged {
  readonly name: string;
  readonly charged: number;
  readonly used: number;
  readonly resetAfter: number;
}

/** What a commit gave back: rate units refunded and leases released. */
export interface Committed {
  readonly refunded: number;
  readonly released: number;
}

/**
 * An answer's fields as the wire type `T` names them, each still to be checked: a field the
 * client reads is spelled as `wire.ts` (held to the server's document) spells it.
 */
export type Fields<T> = { readonly [K in keyof T]?: unknown };

/** One quota a vendor advertises: `quota` calls per `window` seconds (absent: not said). */
export interface Quota {
  readonly quota: number;
  readonly window?: number;
}

/** What a vendor's answer said of its limits, to teach the server (`Client.learn`). */
export interface Lesson {
  /** Where the lesson comes from (`openai headers from api.vendor.example`): 1-128 printable ASCII. */
  readonly source: string;
  /** The quotas advertised (at most 8); none when the answer advertised none. */
  readonly quotas?: readonly Quota[];
  /** Calls the vendor has left in its window. */
  readonly remaining?: number;
  /** Seconds until the vendor's window resets. */
  readonly reset?: number;
  /** The vendor answered "rate limited" and advertised no quota. */
  readonly rateLimited?: boolean;
}

/** The limit the server learned from lessons, while it holds. */
export interface LearnedLimit {
  readonly limit: number;
  /** `advertised` (the vendor's headers) or `rate_limited` (lowered after rate-limit answers). */
  readonly kind: "advertised" | "rate_limited";
  readonly source: string;
  /** Seconds until it is forgotten unless taught again. */
  readonly expiresIn: number;
}

/** The server's answer to a lesson. */
export interface Learnt {
  readonly limit: string;
  /** The limit as configured, and as in force after the lesson. */
  readonly configured: number;
  readonly effective: number;
  /** Seconds the limit is paused fleet-wide (0: none): a vendor with nothing left. */
  readonly paused: number;
  readonly learned: LearnedLimit | null;
}

/** Whether `value` is a plain JSON object. */
export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Seconds from a number of milliseconds in an answer (0 when absent). */
export function secondsOf(milliseconds: unknown): number {
  return typeof milliseconds === "number" ? milliseconds / 1000 : 0;
}

/** One `limits` item of an answer (`reset_ms` and `expires_ms` become seconds). */
export function limitStatus(view: LimitView): LimitStatus {
  return {
    name: view.name,
    remaining: view.remaining,
    resetAfter: view.reset_ms / 1000,
    ...(typeof view.fence === "number" ? { fence: view.fence } : {}),
    ...(typeof view.expires_ms === "number" ? { expiresAfter: view.expires_ms / 1000 } : {}),
  };
}

/** The `limits` array of an answer read defensively: what is not a limit's state is skipped. */
export function limitStatuses(raw: unknown): LimitStatus[] {
  if (!Array.isArray(raw)) {
    return [];
  }
  return raw.filter(isObject).map((item: Fields<LimitView>) => {
    const { fence, expires_ms } = item;
    return limitStatus({
      name: String(item.name ?? ""),
      remaining: typeof item.remaining === "number" ? item.remaining : 0,
      reset_ms: typeof item.reset_ms === "number" ? item.reset_ms : 0,
      ...(typeof fence === "number" ? { fence } : {}),
      ...(typeof expires_ms === "number" ? { expires_ms } : {}),
    });
  });
}

/** The `limits` array of a charge's answer read defensively (`reset_ms` becomes seconds). */
export function chargedViews(raw: unknown): Charged[] {
  if (!Array.isArray(raw)) {
    return [];
  }
  return raw.filter(isObject).map((item: Fields<ChargedView>) => ({
    name: String(item.name ?? ""),
    charged: typeof item.charged === "number" ? item.charged : 0,
    used: typeof item.used === "number" ? item.used : 0,
    resetAfter: secondsOf(item.reset_ms),
  }));
}

/**
 * Units by limit name as sent: a plain object whose values the server judges (its
 * `bad_request` names `costs.<name>`).
 */
export function costsWire(costs: Costs, what: string): Record<string, number> {
  if (!isObject(costs)) {
    throw new TypeError(`${what}: units by limit name (an object), got ${JSON.stringify(costs)}`);
  }
  return { ...costs };
}

/** `"a"` or `["a", "b"]` as a list of names. */
export function limitNames(limits: Limits): string[] {
  if (typeof limits === "string") {
    return [limits];
  }
  const names = [...limits];
  for (const name of names) {
    if (typeof name !== "string") {
      throw new TypeError(`limits: names are strings, got ${JSON.stringify(name)}`);
    }
  }
  if (names.length === 0) {
    throw new RangeError("limits: name at least one limit");
  }
  return names;
}

/** Seconds as whole milliseconds, rounded up: a wait or a pause is never shortened. */
export function milliseconds(value: number, what: string): number {
  if (typeof value !== "number") {
    throw new TypeError(`${what}: seconds as a number, got ${JSON.stringify(value)}`);
  }
  if (Number.isNaN(value) || value < 0) {
    throw new RangeError(`${what}: must be at least 0 seconds, got ${value}`);
  }
  if (!Number.isFinite(value)) {
    throw new RangeError(`${what}: must be finite`);
  }
  // 1.1 s is 1100.0000000000002 ms in binary; that noise must not add a millisecond.
  return Math.ceil(Number((value * 1000).toPrecision(12)));
}
