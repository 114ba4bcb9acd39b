/**
 * The vendor-call protocol of {@link tollgateFetch}, free of I/O: reading `Retry-After`,
 * classifying a vendor's answer, the bounds on pauses and retries, and what this process knows
 * of pauses in force.
 *
 * The classification, in order (a user rule, if given, runs first):
 *
 * - HTTP 429: the vendor is rate limiting; pause the host for its `Retry-After` (or the
 *   configured default when there is none that can be read).
 * - HTTP 503 **with** a `Retry-After` header: load shedding with a stated wait; the same.
 * - HTTP 500, 502, 503 (without `Retry-After`), 504 and 408, and connection failures and
 *   timeouts: transient; retried after a jittered backoff, for idempotent methods only.
 * - anything else: the answer goes back to the caller unchanged.
 *
 * The same rules as tollgate-dispatch's and the Python client's, held to the same test vectors
 * (`crates/dispatch/tests/vectors/retry_after.json`).
 */

import { type Limits, limitNames, type Priority } from "./models.js";

/** Longest `Retry-After` value read, in bytes; an HTTP-date is 29. */
export const RETRY_AFTER_BYTES_MAX = 64;
/** Most retries a wrapper may be configured for. */
export const RETRIES_MAX_LIMIT = 100;
/** Longest pause the server takes (a day), in seconds. */
export const PAUSE_SECONDS_MAX = 24 * 3600;
/** Delta-seconds beyond this saturate: the vendor asked for a long wait, capped later. */
const DELTA_SECONDS_MAX = 2 ** 63;

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const DAYS = "(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)";
const LONG_DAYS = "(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)";
const MONTH = `(${MONTHS.join("|")})`;
const TIME = "(\\d{2}):(\\d{2}):(\\d{2})";
// RFC 9110 section 5.6.7: the preferred form, then the two obsolete ones.
const IMF_FIXDATE = new RegExp(`^${DAYS}, (\\d{2}) ${MONTH} (\\d{4}) ${TIME} GMT$`);
const RFC850_DATE = new RegExp(`^${LONG_DAYS}, (\\d{2})-${MONTH}-(\\d{2}) ${TIME} GMT$`);
const ASCTIME_DATE = new RegExp(`^${DAYS} ${MONTH} ( \\d|\\d{2}) ${TIME} (\\d{4})$`);

const IDEMPOTENT = new Set(["GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"]);
const TRANSIENT_STATUSES = new Set([500, 502, 503, 504, 408]);

/** Seconds since the epoch of a date's parts, or `null` if they name no such moment. */
function utcSeconds(year: number, month: number, day: number, hour: number, minute: number, second: number): number | null {
  if (hour > 23 || minute > 59 || second > 59) {
    return null;
  }
  const at = Date.UTC(year, month, day, hour, minute, second);
  const date = new Date(at);
  // Date.UTC rolls 32 Nov over to 2 Dec; such a date is malformed, not another day.
  if (date.getUTCFullYear() !== year || date.getUTCMonth() !== month || date.getUTCDate() !== day) {
    return null;
  }
  return at / 1000;
}

/** Seconds since the epoch of an HTTP-date in any of its three forms, or `null`. */
function httpDate(text: string, now: number): number | null {
  let match = IMF_FIXDATE.exec(text);
  if (match) {
    const [, day, month, year, hour, minute, second] = match;
    return utcSeconds(Number(year), MONTHS.indexOf(month!), Number(day), Number(hour), Number(minute), Number(second));
  }
  match = RFC850_DATE.exec(text);
  if (match) {
    const [, day, month, shortYear, hour, minute, second] = match;
    // A two-digit year more than 50 years ahead is the latest such year in the past.
    const thisYear = new Date(now * 1000).getUTCFullYear();
    const centuryYear = thisYear - (thisYear % 100) + Number(shortYear);
    const year = centuryYear > thisYear + 50 ? centuryYear - 100 : centuryYear;
    return utcSeconds(year, MONTHS.indexOf(month!), Number(day), Number(hour), Number(minute), Number(second));
  }
  match = ASCTIME_DATE.exec(text);
  if (match) {
    const [, month, day, hour, minute, second, year] = match;
    return utcSeconds(Number(year), MONTHS.indexOf(month!), Number(day!.trim()), Number(hour), Number(minute), Number(second));
  }
  return null;
}

/**
 * The wait a `Retry-After` value asks for, in seconds, measured from `now` (seconds since the
 * epoch; default the wall clock).
 *
 * Whole seconds (`"120"`), or an HTTP-date in any of the three forms HTTP allows (zero if it
 * is past: no wait is invented). Anything else (empty, negative, fractional, a malformed date,
 * longer than {@link RETRY_AFTER_BYTES_MAX}) is `null`, never a guess: the caller falls back to
 * its default.
 */
export function parseRetryAfter(value: string, now: number = Date.now() / 1000): number | null {
  if (value.length > RETRY_AFTER_BYTES_MAX) {
    return null;
  }
  // Optional whitespace around a field value is spaces and tabs (RFC 9110 section 5.6.3).
  const text = value.replace(/^[ \t]+|[ \t]+$/g, "");
  if (text === "" || /[^\x00-\x7f]/.test(text)) {
    return null;
  }
  if (/^[0-9]+$/.test(text)) {
    return Math.min(Number(text), DELTA_SECONDS_MAX);
  }
  const at = httpDate(text, now);
  return at === null ? null : Math.max(0, at - now);
}

/**
 * What to do with a vendor's answer: `done` (hand it to the caller), `retry` (transient: retry
 * after a backoff) or `rate_limited` (pause the host fleet-wide for `retryAfter` seconds, or
 * the configured default when `null`, then retry).
 */
export type Verdict =
  | { readonly kind: "done" }
  | { readonly kind: "retry" }
  | { readonly kind: "rate_limited"; readonly retryAfter: number | null };

/** The three verdicts. */
export const Verdict = {
  done: (): Verdict => ({ kind: "done" }),
  retry: (): Verdict => ({ kind: "retry" }),
  rateLimited: (retryAfter: number | null = null): Verdict => ({ kind: "rate_limited", retryAfter }),
} as const;

/** The default classification of an HTTP answer (see the module documentation). */
export function defaultVerdict(status: number, headers: Headers, now?: number): Verdict {
  const header = headers.get("retry-after");
  const retryAfter = header === null ? null : parseRetryAfter(header, now);
  if (status === 429 || (status === 503 && header !== null)) {
    return Verdict.rateLimited(retryAfter);
  }
  if (TRANSIENT_STATUSES.has(status)) {
    return Verdict.retry();
  }
  return Verdict.done();
}

/** Whether a failure of `fetch` may pass: no connection, a reset, or a timeout. */
export function transient(error: unknown): boolean {
  if (!(error instanceof Error)) {
    return false;
  }
  if (error.name === "TimeoutError") {
    return true;
  }
  const cause = error.cause;
  const code = typeof cause === "object" && cause !== null && "code" in cause ? cause.code : undefined;
  return (
    typeof code === "string" &&
    [
      "ECONNREFUSED",
      "ECONNRESET",
      "ETIMEDOUT",
      "EHOSTUNREACH",
      "ENETUNREACH",
      "EAI_AGAIN",
      "EPIPE",
      "UND_ERR_CONNECT_TIMEOUT",
      "UND_ERR_HEADERS_TIMEOUT",
      "UND_ERR_SOCKET",
    ].includes(code)
  );
}

export function idempotent(method: string): boolean {
  return IDEMPOTENT.has(method.toUpperCase());
}

/** A user rule: a verdict to decide, `null` (or nothing) to let the defaults decide. */
export type Classifier = (response: Response) => Verdict | null | undefined;

/** The limits a host's requests take, all or none; pauses go on the first. */
export interface Host {
  readonly names: readonly string[];
  readonly pauseTarget: string;
}

/** What {@link tollgateFetch} is configured with besides its client; times in seconds. */
export interface PolicyOptions {
  /** Maps a host (`api.vendor.example`, or `host:port` for one port) to its limit(s). */
  hosts: Readonly<Record<string, Limits>>;
  /** The priority of requests that do not set one (default `normal`). */
  priority?: Priority;
  /** Longest one attempt waits for quota, pauses included (default 60). */
  waitMax?: number;
  /** Retries after the first attempt (default 3). */
  retriesMax?: number;
  /** Wait before retrying a transient failure (default 0.1), doubling up to `backoffMax`. */
  backoff?: number;
  /** Longest backoff (default 5). */
  backoffMax?: number;
  /** The pause when a vendor's answer gives no readable wait (default 30). */
  retryAfterDefault?: number;
  /** The longest pause a vendor can cause (default 900). */
  retryAfterMax?: number;
  /** A random extra added to every pause (default 0.25). */
  resumeJitterMax?: number;
  /** A rule run before the defaults. */
  classify?: Classifier;
}

function seconds(name: string, value: number, allowZero = true): number {
  if (typeof value !== "number" || Number.isNaN(value)) {
    throw new TypeError(`${name}: seconds as a number, got ${JSON.stringify(value)}`);
  }
  if (value < 0 || (value === 0 && !allowZero) || !Number.isFinite(value)) {
    throw new RangeError(`${name}: must be ${allowZero ? "at least 0" : "above 0"} and finite, got ${value}`);
  }
  return value;
}

/** Monotonic seconds. */
export function monotonic(): number {
  return performance.now() / 1000;
}

/** A wrapper's configuration, its host map, and the pauses this process knows of. */
export class Policy {
  readonly hosts: ReadonlyMap<string, Host>;
  readonly priority: Priority;
  readonly waitMax: number;
  readonly retriesMax: number;
  readonly backoffBase: number;
  readonly backoffMax: number;
  readonly retryAfterDefault: number;
  readonly retryAfterMax: number;
  readonly resumeJitterMax: number;
  readonly userClassify: Classifier | undefined;
  readonly #pausedUntil = new Map<string, number>();

  /** `hostsRequired`: false when a fetch has other hosts to serve (token budgets). */
  constructor(options: PolicyOptions, hostsRequired = true) {
    const priority = options.priority ?? "normal";
    if (!["high", "normal", "low"].includes(priority)) {
      throw new RangeError(`priority: must be high, normal or low, got ${JSON.stringify(priority)}`);
    }
    this.priority = priority;
    const entries = Object.entries(options.hosts ?? {});
    if (entries.length === 0 && hostsRequired) {
      throw new RangeError("hosts: map at least one host to its limits (or give llm)");
    }
    this.hosts = new Map(
      entries.map(([host, limits]) => {
        const names = limitNames(limits);
        return [host.toLowerCase(), { names, pauseTarget: names[0]! }];
      }),
    );
    this.waitMax = seconds("waitMax", options.waitMax ?? 60, false);
    const retriesMax = options.retriesMax ?? 3;
    if (!Number.isInteger(retriesMax) || retriesMax < 0 || retriesMax > RETRIES_MAX_LIMIT) {
      throw new RangeError(`retriesMax: must be a whole number from 0 to ${RETRIES_MAX_LIMIT}, got ${retriesMax}`);
    }
    this.retriesMax = retriesMax;
    this.backoffBase = seconds("backoff", options.backoff ?? 0.1);
    this.backoffMax = seconds("backoffMax", options.backoffMax ?? 5);
    if (this.backoffBase > this.backoffMax) {
      throw new RangeError("backoff: must be at most backoffMax");
    }
    this.retryAfterDefault = seconds("retryAfterDefault", options.retryAfterDefault ?? 30, false);
    this.retryAfterMax = seconds("retryAfterMax", options.retryAfterMax ?? 900);
    if (this.retryAfterDefault > this.retryAfterMax) {
      throw new RangeError("retryAfterDefault: must be at most retryAfterMax");
    }
    this.resumeJitterMax = seconds("resumeJitterMax", options.resumeJitterMax ?? 0.25);
    if (this.retryAfterMax + this.resumeJitterMax > PAUSE_SECONDS_MAX) {
      throw new RangeError("retryAfterMax: with resumeJitterMax, must be at most a day (86400 s)");
    }
    this.userClassify = options.classify;
  }

  /** The host entry for a request's URL: `host:port` first, then `host`. */
  hostFor(url: URL): Host | undefined {
    return (url.port === "" ? undefined : this.hosts.get(url.host)) ?? this.hosts.get(url.hostname);
  }

  classify(response: Response): Verdict {
    return this.userClassify?.(response) ?? defaultVerdict(response.status, response.headers);
  }

  /**
   * The pause for a rate-limit answer: the vendor's wait (cut to `retryAfterMax`) or the
   * default, plus a random resumption jitter, never less than asked. `null` when the vendor
   * asked for no wait: no pause is invented.
   */
  pauseFor(retryAfter: number | null): number | null {
    const asked = Math.min(retryAfter ?? this.retryAfterDefault, this.retryAfterMax);
    return asked <= 0 ? null : asked + this.jitter();
  }

  jitter(): number {
    return Math.random() * this.resumeJitterMax;
  }

  /**
   * The wait before retry `attempt + 1`: `backoff * 2 ** attempt` capped at `backoffMax`,
   * drawn between half and all of it.
   */
  backoff(attempt: number): number {
    const full = Math.min(this.backoffBase * 2 ** Math.min(attempt, 62), this.backoffMax);
    return full / 2 + Math.random() * (full / 2);
  }

  /** Seconds until the pause this process knows of on the host's limits ends (0: none). */
  pausedFor(host: Host): number {
    const until = Math.max(0, ...host.names.map((name) => this.#pausedUntil.get(name) ?? 0));
    return Math.max(0, until - monotonic());
  }

  /** Remember a pause of `limit` until `until` (monotonic seconds); pauses only extend. */
  notePause(limit: string, until: number): void {
    if ((this.#pausedUntil.get(limit) ?? 0) < until) {
      this.#pausedUntil.set(limit, until);
    }
  }
}

/** The message of a wait for quota that ran out. */
export function timedOutMessage(host: Host, waitMax: number, paused: boolean): string {
  return `no quota on ${host.names.join(", ")} within ${waitMax} s${paused ? " (paused)" : ""}`;
}
