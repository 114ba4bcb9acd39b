/**
 * The client of HTTP API v1: {@link Client}, its {@link Permit} and its admin API
 * ({@link LimitsAdmin}).
 */

import { errorFromAnswer, RateLimited, ServerError, ServerUnreachable } from "./errors.js";
import {
  givenAdminToken,
  type KeptToken,
  keptAdminToken,
  PROOF_NONCE_PARAMETER,
  PROOF_PATH,
  proofNonce,
  proved,
  refusal,
} from "./kept.js";
import {
  type Charged,
  chargedViews,
  type Committed,
  type Costs,
  costsWire,
  type Fields,
  isObject,
  type Learnt,
  type Lesson,
  type Limits,
  limitNames,
  type LimitStatus,
  limitStatuses,
  milliseconds,
  type Priority,
  secondsOf,
} from "./models.js";
import type * as Wire from "./wire.js";

/** Where `tollgate serve` listens by default: the URL of a client given none and no `TOLLGATE_SERVER`. */
export const DEFAULT_URL = "http://127.0.0.1:7070";
/** Seconds one call may take; a waiting acquire gets its wait on top. */
export const DEFAULT_TIMEOUT = 10;

/**
 * How a {@link Client} reaches its server. What is not given is read as the `tollgate`
 * commands read it, the first found winning: the URL is `url`, else `TOLLGATE_SERVER`, else
 * `http://127.0.0.1:7070`; the data plane's token is `token`, else `TOLLGATE_DATA_TOKEN`, else
 * none (a server with no data token set needs none); the admin API's is `adminToken`, else
 * `token`, else `TOLLGATE_ADMIN_TOKEN`, else the token a local server keeps for this user, sent
 * to that server alone once it has proved it holds it. `TOLLGATE_DATA_TOKEN` is never sent to
 * the admin API. The environment is read when the client is made, but for
 * `TOLLGATE_ADMIN_TOKEN`, read at each admin call.
 */
export interface ClientOptions {
  /** The server's URL (else `TOLLGATE_SERVER`, else `http://127.0.0.1:7070`). */
  url?: string;
  /**
   * The data plane's bearer token (else `TOLLGATE_DATA_TOKEN`) and, unless `adminToken` is
   * given, the admin API's.
   */
  token?: string;
  /** The admin API's bearer token (else `token`, else `TOLLGATE_ADMIN_TOKEN`, else a kept one). */
  adminToken?: string;
  /** Seconds one call may take (default 10); a waiting acquire gets its wait on top. */
  timeout?: number;
  /** The `fetch` to send with (default the global one): for tests, or a custom agent. */
  fetch?: typeof fetch;
}

/** How an acquire asks. */
export interface AcquireOptions {
  /** Units to take of every limit named that `costs` does not name (default 1). */
  cost?: number;
  /**
   * Units of some limits by name where they differ from `cost`, each name among the limits: one
   * decision, all or none (`{ itpm: 812, otpm: 1000 }` beside a request limit's one unit).
   */
  costs?: Costs;
  /** `high`, `normal` (default) or `low`. */
  priority?: Priority;
  /** Seconds to wait for room at the server (default 0: answer at once). */
  wait?: number;
  /** The counter of limits counted `per` key. */
  key?: string;
}

/** What a charge counts. */
export interface ChargeOptions {
  /** Units to charge every limit named that `costs` does not name (default 1). */
  cost?: number;
  /** Units to charge some limits by name, where they differ from `cost`. */
  costs?: Costs;
  /** The counter of limits counted `per` key. */
  key?: string;
}

/** How a pause is asked for. */
export interface PauseOptions {
  /** How long nothing is granted, in seconds. */
  seconds: number;
  /** For a limit counted per key: pause this key's counter only. */
  key?: string;
}

/** How a commit reports the call it stands for. */
export interface CommitOptions {
  /**
   * Seconds from the grant's answer reaching this process to the request leaving for the
   * vendor: the server widens the limit's margin to cover the longest it sees.
   */
  sentAfter?: number;
}

/** An inbound request to decide on (`/v1/check`). */
export interface CheckRequest {
  /** Who makes the request: the key for limits counted `per` key. */
  user?: string;
  method: string;
  /** The path as received; the server normalizes it before matching. */
  path: string;
}

/**
 * The answer to "may this inbound request proceed?".
 *
 * `path` is the normalized path that was matched and `matched` the names of the limits that
 * applied. When denied, `retryAfter` says when to try again (seconds) and `reason` why; when
 * allowed and a concurrency limit applied, `permit` holds the lease to commit once the request
 * is done.
 */
export interface CheckResult {
  readonly allowed: boolean;
  readonly path: string;
  readonly matched: string[];
  readonly limits: LimitStatus[];
  readonly retryAfter?: number;
  readonly reason?: Wire.RateLimitedBody["reason"] | null;
  readonly permit?: Permit;
}

/** The limits in force, with the version of the rules and the rows that failed validation. */
export interface LimitList {
  readonly version: number;
  readonly limits: Wire.StoredLimit[];
  readonly rejected: Wire.RejectedRow[];
}

/** An answer read whole: its status, headers and body text. */
interface Answer {
  status: number;
  headers: Headers;
  text: string;
  /** When its head arrived, monotonic seconds: before its body is read and other work queued. */
  at: number;
  /** When the request was sent, monotonic seconds. */
  asked: number;
}

/**
 * All a permit was granted, as its commit says it: `cost`, or with per-limit costs each rate
 * limit's own (a lease carries a fence and is released whether named or not).
 */
function allUnits(limits: LimitStatus[], cost: number, costs: Costs): number | Record<string, number> {
  if (Object.keys(costs).length === 0) {
    return cost;
  }
  return Object.fromEntries(
    limits.filter((status) => status.fence === undefined).map((status) => [status.name, costs[status.name] ?? cost]),
  );
}

function permitPath(id: string, action: "commit" | "renew"): string {
  return `/v1/permits/${encodeURIComponent(id)}/${action}`;
}

function limitPath(name: string): string {
  return `/v1/limits/${encodeURIComponent(name)}`;
}

/** The JSON object of a success, or the error an error answer stands for. */
function decode(answer: Answer): Record<string, unknown> {
  if (answer.status >= 400) {
    throw errorFromAnswer(answer.status, answer.headers, answer.text);
  }
  let body: unknown;
  try {
    body = JSON.parse(answer.text);
  } catch {
    throw new ServerError(`HTTP ${answer.status} with a body that is not JSON`, { status: answer.status });
  }
  if (!isObject(body)) {
    throw new ServerError(`HTTP ${answer.status} with a body that is not a JSON object`, {
      status: answer.status,
    });
  }
  return body;
}

function count(value: unknown): number {
  return typeof value === "number" ? value : 0;
}

/**
 * What an acquire granted: rate units, and a lease for each concurrency limit.
 *
 * With `await using permit = await client.acquire(...)`, leaving the block commits `used`
 * units (all that was granted unless `used` was set in the block) and releases any lease.
 * JavaScript does not tell a disposer whether the block threw, so set `used` last in the block:
 * a block that throws before setting it commits all that was granted, which refunds nothing (the call may
 * have happened) and releases any lease. For "nothing on a throw" whatever was set, run the
 * work through {@link Client.limited}. After an explicit {@link commit} or {@link release},
 * leaving the block does nothing more.
 */
export class Permit implements AsyncDisposable {
  /** The opaque permit id. */
  readonly id: string;
  /** Each limit's state at the grant. */
  readonly limits: LimitStatus[];
  /** Units granted of every limit that `costs` does not name. */
  readonly cost: number;
  /** Units granted by limit name, where they differ from `cost`. */
  readonly costs: Costs;
  /**
   * Units to commit when the permit is disposed (a number, or units by limit name);
   * `undefined` means all that was granted.
   */
  used: number | Costs | undefined = undefined;
  /** @internal When the grant's answer reached this process, monotonic seconds. */
  readonly grantedAt: number;
  readonly #client: Client;
  #settled = false;

  /** @internal Made by {@link Client}. */
  constructor(
    client: Client,
    id: string,
    limits: LimitStatus[],
    cost: number,
    grantedAt = performance.now() / 1000,
    costs: Costs = {},
  ) {
    this.#client = client;
    this.grantedAt = grantedAt;
    this.id = id;
    this.limits = limits;
    this.cost = cost;
    this.costs = { ...costs };
  }

  /** The fencing number of the permit's lease, or `undefined` if it holds no lease. */
  get fence(): number | undefined {
    return this.limits.find((status) => status.fence !== undefined)?.fence;
  }

  /** Whether the permit was committed or released (or that was attempted). */
  get settled(): boolean {
    return this.#settled;
  }

  /**
   * Say `used` units were used (default: `this.used`, else all that was granted). A number
   * counts for every rate limit of the permit; an object gives each rate limit's own by name
   * (for a permit granted with `costs`) and must name every rate limit of the permit and
   * nothing else (a lease is released whether named or not). The rest of the rate units are
   * refunded and leases released. Once per permit: a second commit throws {@link Conflict}.
   * `sentAfter` reports how long after the grant the call left.
   */
  async commit(used?: number | Costs, options: CommitOptions = {}): Promise<Committed> {
    const units = used ?? this.used ?? this.#all();
    const sentAfterMs = options.sentAfter === undefined ? undefined : milliseconds(options.sentAfter, "sentAfter");
    this.#settled = true;
    const body: Wire.CommitBody = {
      used: typeof units === "number" ? units : costsWire(units, "used"),
      ...(sentAfterMs === undefined ? {} : { sent_after_ms: sentAfterMs }),
    };
    const answer: Fields<Wire.CommitAnswer> = await this.#client.request("POST", permitPath(this.id, "commit"), body);
    return { refunded: count(answer.refunded), released: count(answer.released) };
  }

  /** End the permit's leases; its rate units stay used. */
  async release(): Promise<Committed> {
    return this.commit(this.#all());
  }

  #all(): number | Record<string, number> {
    return allUnits(this.limits, this.cost, this.costs);
  }

  /**
   * Extend every lease of the permit by its TTL; resolves to the seconds until the earliest
   * expires. Throws {@link Conflict} for a rate-only permit or a lease already gone.
   */
  async renew(): Promise<number> {
    const answer: Fields<Wire.RenewAnswer> = await this.#client.request("POST", permitPath(this.id, "renew"), {});
    return secondsOf(answer.expires_ms);
  }

  /** Settle as a finished block does: commit `used` (all of `cost` unless set). */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.#settled) {
      await this.commit();
    }
  }

  /** @internal Settle after work that threw: nothing committed, any lease released. */
  async abandon(): Promise<void> {
    if (this.#settled) {
      return;
    }
    this.#settled = true;
    if (this.fence === undefined) {
      return;
    }
    try {
      await this.commit(this.#all());
    } catch {
      // The work's own error matters more; the lease runs to its TTL.
    }
  }

  toString(): string {
    return `Permit(${this.id}, cost ${this.cost})`;
  }
}

/**
 * The admin API (`client.limits`): put, get, list and delete limits. Fields use the server's
 * names (`kind`, `limit`, `period_ms`, `algorithm`, `burst`, `margin_ms`, `lease_ttl_ms`,
 * `reserve`, `per`, `keys_max`, `match`). Calls use `adminToken` (or else `token`).
 */
export class LimitsAdmin {
  readonly #client: Client;

  /** @internal Made by {@link Client}. */
  constructor(client: Client) {
    this.#client = client;
  }

  /** Create or replace limit `name`; resolves to it as stored, defaults filled in. */
  async put(name: string, rule: Wire.LimitRule): Promise<Wire.StoredLimit> {
    return (await this.#client.request("PUT", limitPath(name), rule, { admin: true })) as unknown as Wire.StoredLimit;
  }

  /** Limit `name` as stored; {@link NotFound} if there is none. */
  async get(name: string): Promise<Wire.StoredLimit> {
    return (await this.#client.request("GET", limitPath(name), null, { admin: true })) as unknown as Wire.StoredLimit;
  }

  /** Every limit in force, the rules' version, and the rows that failed validation. */
  async list(): Promise<LimitList> {
    const body: Fields<Wire.LimitList> = await this.#client.request("GET", "/v1/limits", null, { admin: true });
    return {
      version: count(body.version),
      limits: Array.isArray(body.limits) ? (body.limits as Wire.StoredLimit[]) : [],
      rejected: Array.isArray(body.rejected) ? (body.rejected as Wire.RejectedRow[]) : [],
    };
  }

  /** Remove limit `name`; {@link NotFound} if there is none. */
  async delete(name: string): Promise<void> {
    await this.#client.request("DELETE", limitPath(name), null, { admin: true });
  }
}

/**
 * A client of a Tollgate server. One per process is enough: calls share `fetch`'s
 * connection pool and may run concurrently.
 */
export class Client {
  /** The server's URL, without a trailing slash. */
  readonly url: string;
  /** The admin API. */
  readonly limits: LimitsAdmin;
  readonly #token: string | undefined;
  /** `TOLLGATE_DATA_TOKEN` when no token was given: for the data plane alone. */
  readonly #dataTokenFromEnvironment: string | undefined;
  readonly #adminToken: string | undefined;
  readonly #timeout: number;
  readonly #fetch: typeof fetch;

  constructor(options: ClientOptions = {}) {
    this.url = (options.url || process.env["TOLLGATE_SERVER"] || DEFAULT_URL).replace(/\/+$/, "");
    this.#token = options.token;
    this.#dataTokenFromEnvironment = options.token ? undefined : process.env["TOLLGATE_DATA_TOKEN"] || undefined;
    this.#adminToken = options.adminToken;
    const timeout = options.timeout ?? DEFAULT_TIMEOUT;
    if (!(timeout > 0) || !Number.isFinite(timeout)) {
      throw new RangeError(`timeout: seconds above 0, got ${timeout}`);
    }
    this.#timeout = timeout;
    this.#fetch = options.fetch ?? globalThis.fetch;
    this.limits = new LimitsAdmin(this);
  }

  // ---- requests ---------------------------------------------------------------------------

  /** Send one request and read its answer whole; no answer at all is {@link ServerUnreachable}. */
  async #send(method: string, path: string, body: object | null, admin: boolean, wait: number): Promise<Answer> {
    const headers: Record<string, string> = {};
    let url = this.url + path;
    // For the data plane: the token given, else TOLLGATE_DATA_TOKEN. For the admin API: the
    // admin token given, else the data token given, else TOLLGATE_ADMIN_TOKEN, else the one a
    // local server keeps for this user, sent to the address it recorded once the server there
    // has proved it holds it.
    let token = admin
      ? (this.#adminToken ?? this.#token ?? givenAdminToken())
      : this.#token || this.#dataTokenFromEnvironment;
    if (admin && token === undefined) {
      const kept = keptAdminToken(this.url);
      if (kept !== undefined && (await this.#proved(kept))) {
        url = kept.base + path;
        token = kept.token;
      }
    }
    if (token) {
      headers["authorization"] = `Bearer ${token}`;
    }
    if (body !== null) {
      headers["content-type"] = "application/json";
    }
    const asked = performance.now() / 1000;
    try {
      const response = await this.#fetch(url, {
        method,
        headers,
        body: body === null ? null : JSON.stringify(body),
        signal: AbortSignal.timeout(Math.ceil((this.#timeout + wait) * 1000)),
      });
      const at = performance.now() / 1000;
      return { status: response.status, headers: response.headers, text: await response.text(), at, asked };
    } catch (error) {
      const detail =
        error instanceof Error && error.name === "TimeoutError"
          ? `no answer within ${this.#timeout + wait} s`
          : describe(error);
      throw new ServerUnreachable(`no answer from the Tollgate server at ${this.url}: ${detail}`, { cause: error });
    }
  }

  /**
   * Whether the server at the address `kept` records proves it holds that token: asked with a
   * fresh nonce before every call that would send it, with no token sent. Says why not.
   */
  async #proved(kept: KeptToken): Promise<boolean> {
    const nonce = proofNonce();
    let why: string;
    try {
      const response = await this.#fetch(`${kept.base}${PROOF_PATH}?${PROOF_NONCE_PARAMETER}=${nonce}`, {
        signal: AbortSignal.timeout(Math.ceil(this.#timeout * 1000)),
      });
      const text = await response.text();
      if (response.status !== 200) {
        why = `it answered ${response.status}`;
      } else {
        let answer: unknown = null;
        try {
          answer = JSON.parse(text);
        } catch {
          // Not JSON: no proof.
        }
        if (proved(kept.token, kept.listen, nonce, answer)) {
          return true;
        }
        why = "its proof does not match";
      }
    } catch (error) {
      why = `no answer: ${describe(error)}`;
    }
    process.emitWarning(refusal(kept, why), "TollgateWarning");
    return false;
  }

  /** @internal A call whose success is a JSON object. */
  async request(
    method: string,
    path: string,
    body: object | null,
    { admin = false, wait = 0 }: { admin?: boolean; wait?: number } = {},
  ): Promise<Record<string, unknown>> {
    return decode(await this.#send(method, path, body, admin, wait));
  }

  // ---- data plane -------------------------------------------------------------------------

  /**
   * Take `cost` units of every limit named (all or none), waiting up to `wait` seconds for
   * room (default: answer at once); `costs` the units of some limits by name where they differ
   * from `cost`, in the same decision. `key` picks the counter of limits counted per key.
   * Rejects with {@link RateLimited} when nothing was granted in time.
   */
  async acquire(limits: Limits, options: AcquireOptions = {}): Promise<Permit> {
    const cost = options.cost ?? 1;
    const waitMs = milliseconds(options.wait ?? 0, "wait");
    // Values only the server can judge (an unknown priority, a zero cost) are sent as given,
    // so that its bad_request names the field.
    const body: Wire.AcquireBody = {
      limits: limitNames(limits),
      cost,
      ...(options.costs === undefined ? {} : { costs: costsWire(options.costs, "costs") }),
      priority: options.priority ?? "normal",
      wait_ms: waitMs,
      ...(options.key === undefined ? {} : { key: options.key }),
    };
    const raw = await this.#send("POST", "/v1/acquire", body, false, waitMs / 1000);
    const answer: Fields<Wire.Granted> = decode(raw);
    if (typeof answer.permit !== "string") {
      throw new ServerError("the grant carries no permit id");
    }
    // The grant was made when the server let the request go (its Server-Timing says how long
    // it held it): the time since is the answer's way back, which the margin must cover too.
    const held = serverHeld(raw.headers.get("server-timing"));
    const grantedAt = held === null ? raw.at : Math.min(raw.asked + held, raw.at);
    return new Permit(this, answer.permit, limitStatuses(answer.limits), cost, grantedAt, options.costs);
  }

  /**
   * Count units spent beyond any grant (`POST /v1/charge`): what a vendor counted over a
   * permit's cost, say a model's answer longer than its estimate. Counted on each rate limit
   * named at once, even past the limit (at most one capacity past it), so that every later
   * acquire in the fleet waits the debt out; never denied. A concurrency limit is a
   * {@link BadRequest} on `limits`. Resolves to each limit's {@link Charged}.
   */
  async charge(limits: Limits, options: ChargeOptions = {}): Promise<Charged[]> {
    const body: Wire.ChargeBody = {
      limits: limitNames(limits),
      ...(options.cost === undefined ? {} : { cost: options.cost }),
      ...(options.costs === undefined ? {} : { costs: costsWire(options.costs, "costs") }),
      ...(options.key === undefined ? {} : { key: options.key }),
    };
    const answer: Fields<Wire.ChargeAnswer> = await this.request("POST", "/v1/charge", body);
    return chargedViews(answer.limits);
  }

  /** Like {@link acquire}, but `null` instead of rejecting with {@link RateLimited}. */
  async tryAcquire(limits: Limits, options: AcquireOptions = {}): Promise<Permit | null> {
    try {
      return await this.acquire(limits, options);
    } catch (error) {
      if (error instanceof RateLimited) {
        return null;
      }
      throw error;
    }
  }

  /**
   * Grant nothing on `limit` (or only its counter for `key`) for `seconds`, fleet-wide.
   * Pauses only extend: resolves to the seconds until the pause in force ends.
   */
  async pause(limit: string, options: PauseOptions): Promise<number> {
    const body: Wire.PauseBody = {
      limit,
      retry_after_ms: milliseconds(options.seconds, "seconds"),
      ...(options.key === undefined ? {} : { key: options.key }),
    };
    const answer: Fields<Wire.PauseAnswer> = await this.request("POST", "/v1/pause", body);
    return secondsOf(answer.paused_ms);
  }

  /**
   * Teach the server what a vendor's answer said of its limits (`POST /v1/learn`): the rate
   * limit `limit` in front of that vendor is lowered to the least quota advertised (converted
   * to its period, never above its configured value) for a while, and paused fleet-wide when
   * the vendor has nothing left (`remaining` 0 with a `reset`). `rateLimited` says the vendor
   * refused a call without advertising a quota: the server lowers the limit step by step.
   * Needs the admin token or a data token that may pause the limit.
   */
  async learn(limit: string, lesson: Lesson): Promise<Learnt> {
    const body: Wire.LearnBody = {
      limit,
      source: lesson.source,
      quotas: (lesson.quotas ?? []).map((item, index) => ({
        quota: item.quota,
        ...(item.window === undefined ? {} : { window_ms: milliseconds(item.window, `quotas[${index}].window`) }),
      })),
      ...(lesson.remaining === undefined ? {} : { remaining: lesson.remaining }),
      ...(lesson.reset === undefined ? {} : { reset_ms: milliseconds(lesson.reset, "reset") }),
      ...(lesson.rateLimited === undefined ? {} : { rate_limited: lesson.rateLimited }),
    };
    const answer: Fields<Wire.LearnAnswer> = await this.request("POST", "/v1/learn", body);
    const learned: Fields<Wire.Learned> | null = isObject(answer.learned) ? answer.learned : null;
    return {
      limit: String(answer.limit ?? limit),
      configured: count(answer.configured),
      effective: count(answer.effective),
      paused: secondsOf(answer.paused_ms),
      learned:
        learned === null
          ? null
          : {
              limit: count(learned.limit),
              kind: learned.kind === "rate_limited" ? "rate_limited" : "advertised",
              source: String(learned.source ?? ""),
              expiresIn: secondsOf(learned.expires_in_ms),
            },
    };
  }

  /**
   * May `user` make the inbound request `method path` now? Applies every limit whose `match`
   * fits, all or none. A denial is `allowed: false` (with `retryAfter`), not a rejection. When
   * a concurrency limit applied, the result's `permit` holds the lease: commit it when the
   * request is done.
   */
  async check(request: CheckRequest): Promise<CheckResult> {
    const body: Wire.CheckBody = {
      method: request.method,
      path: request.path,
      ...(request.user === undefined ? {} : { user: request.user }),
    };
    const answer = await this.#send("POST", "/v1/check", body, false, 0);
    if (answer.status === 429) {
      const error = errorFromAnswer(answer.status, answer.headers, answer.text);
      let body: unknown = null;
      try {
        body = JSON.parse(answer.text);
      } catch {
        throw error;
      }
      if (!(error instanceof RateLimited) || !isObject(body)) {
        throw error;
      }
      const denied: Fields<Wire.CheckDenied> = body;
      return {
        allowed: false,
        path: String(denied.path ?? ""),
        matched: names(denied.matched),
        limits: error.limits,
        retryAfter: error.retryAfter,
        reason: error.reason,
      };
    }
    const allowed: Fields<Wire.CheckAnswer> = decode(answer);
    const limits = limitStatuses(allowed.limits);
    const permit = allowed.permit;
    return {
      allowed: allowed.allowed === true,
      path: String(allowed.path ?? ""),
      matched: names(allowed.matched),
      limits,
      ...(typeof permit === "string" ? { permit: new Permit(this, permit, limits, 1) } : {}),
    };
  }

  /**
   * Wrap `work` to run under a permit: each call acquires first (rejecting with
   * {@link RateLimited} before `work` runs when nothing comes in time), passes the permit
   * first and the call's arguments after it, and settles it when `work` settles: a result commits `permit.used`
   * (all of `cost` unless set); a throw commits nothing (the rate units stay spent, the call
   * may have happened) and releases any lease.
   */
  limited<Args extends unknown[], Result>(
    limits: Limits,
    options: AcquireOptions,
    work: (permit: Permit, ...args: Args) => Promise<Result> | Result,
  ): (...args: Args) => Promise<Result> {
    limitNames(limits);
    milliseconds(options.wait ?? 0, "wait");
    return async (...args: Args): Promise<Result> => {
      const permit = await this.acquire(limits, options);
      let result: Result;
      try {
        result = await work(permit, ...args);
      } catch (error) {
        await permit.abandon();
        throw error;
      }
      if (!permit.settled) {
        await permit.commit();
      }
      return result;
    };
  }
}

function names(raw: unknown): string[] {
  return Array.isArray(raw) ? raw.map(String) : [];
}

/** A failure of `fetch` in a sentence: Node's "fetch failed" says less than its cause. */
function describe(error: unknown): string {
  if (!(error instanceof Error)) {
    return String(error);
  }
  const cause = error.cause;
  if (cause instanceof Error && cause.message) {
    return `${error.message}: ${cause.message}`;
  }
  return error.message || error.name;
}

/**
 * How long a Tollgate server held an acquire, in seconds, from its
 * `Server-Timing: acquire;dur=MS`; `null` when it says nothing readable.
 */
export function serverHeld(value: string | null): number | null {
  if (value === null) {
    return null;
  }
  for (const metric of value.split(",")) {
    const [name, ...parameters] = metric.split(";").map((part) => part.trim());
    if (name !== "acquire") {
      continue;
    }
    const duration = parameters.find((part) => part.startsWith("dur="));
    const ms = duration === undefined ? NaN : Number(duration.slice(4));
    if (Number.isFinite(ms) && ms >= 0 && ms <= 86_400_000 && duration!.slice(4).trim() !== "") {
      return ms / 1000;
    }
  }
  return null;
}
