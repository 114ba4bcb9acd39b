/**
 * {@link tollgateFetch}: a `fetch` for calling vendors that takes each mapped host's quota
 * from a Tollgate server before every request, and turns the vendor's rate-limit answers into
 * a pause for the whole fleet.
 *
 * For a request to a mapped host it:
 *
 * 1. waits out any pause of the host's limits this process knows of, plus a random jitter so
 *    that a fleet does not resume in one burst;
 * 2. takes one unit of every limit mapped to the host (all or none), waiting up to `waitMax`;
 * 3. sends the request, and classifies the answer (see `dispatch.ts`): on 429, or 503 with
 *    `Retry-After`, it pauses the host's first limit on the server for the vendor's wait (cut
 *    to `retryAfterMax`, plus jitter, never less than asked), so that every process of the
 *    fleet holds its requests until the vendor's cessation ends, and retries; on a transient
 *    failure it retries an idempotent request after a jittered, doubling backoff;
 * 4. unless `learn` is off, reads the vendor's rate-limit headers (see `vendor.ts`) and teaches
 *    the server what they say of the host's first limit (`Client.learn`) when it is news: the
 *    quotas advertised differ from the last taught (or that was a minute ago), the vendor has
 *    nothing left, or it refused a call without advertising a quota. The server lowers the
 *    limit to the vendor's, or pauses it fleet-wide until the vendor's window resets, and that
 *    pause holds this process at once. A lesson that fails is logged (`NODE_DEBUG=tollgate`)
 *    and never fails the request;
 * 5. commits the unit (the call happened), with the time from the grant to the request's
 *    leaving unless `learn` is off (the server widens the limit's margin to cover it), and
 *    releases the lease of a concurrency limit, after recording a pause, so that with a
 *    concurrency limit of 1 no other request leaves before the pause is in force.
 *
 * Retries (for rate limiting and transient failures together) stop after `retriesMax`; the
 * last answer then goes back to the caller as the vendor gave it. A body given as a
 * `ReadableStream` cannot be replayed: it is sent once (its rate-limit answer still pauses the
 * host). Requests to hosts not in the mapping pass through untouched.
 *
 * When no quota comes within `waitMax`, the request rejects with {@link RateLimited} (nothing
 * was sent); failures of the Tollgate server reject with the other {@link TollgateError}
 * classes. Set one request's priority with `init.tollgate.priority`.
 *
 * Language-model APIs: `llm` maps a host to its token {@link Budget} (requests, input tokens and
 * output tokens per period). A model call to such a host takes its estimated tokens and one
 * request before it goes, and is settled on what its answer reports as it streams (see
 * `llm.ts`); other requests go as above, and `hosts` may then be empty. A host in both maps has
 * its model calls go through the budget first, then through the steps above (its vendor's 429
 * pauses the host's first limit in `hosts`). `init.tollgate.inputTokens` is the caller's own
 * count of a call's input tokens.
 */

import { debuglog } from "node:util";

import type { Client, Permit } from "./client.js";
import {
  type Host,
  idempotent,
  monotonic,
  Policy,
  type PolicyOptions,
  timedOutMessage,
  transient,
  Verdict,
} from "./dispatch.js";
import { BadRequest, RateLimited, TollgateError } from "./errors.js";
import { type Budget, llmFetch } from "./llm.js";
import type { Lesson, Priority, Quota } from "./models.js";
import { type Advice, readAdvice } from "./vendor.js";

const debug = debuglog("tollgate");

/** The shortest sleep between two asks when the server answers before the deadline, seconds. */
const ASK_INTERVAL_MIN = 0.01;
/** Quotas already taught are taught again after this long, seconds: the server forgets. */
const LESSON_REFRESH = 60;
/** The longest grant-to-send delay the server takes, seconds. */
const SENT_AFTER_MAX = 3600;
/** The longest source of a lesson, bytes. */
const SOURCE_BYTES_MAX = 128;
/** The largest quota and the longest window a lesson carries; beyond, the vendor says nothing usable. */
const QUOTA_MAX = 2 ** 53;
const WINDOW_MS_MAX = 366 * 86_400_000;

/** How {@link tollgateFetch} is configured; times in seconds. */
export interface TollgateFetchOptions extends PolicyOptions {
  /** The Tollgate server that holds the hosts' quotas. */
  client: Client;
  /** The `fetch` that sends (default the global one). */
  fetch?: typeof fetch;
  /** Told what could not be done and did not fail the request (a pause the server refused). */
  onWarning?: (message: string, error: unknown) => void;
  /**
   * Teach the server the vendor's rate-limit headers and report each request's grant-to-send
   * delay (default true). Off: neither; pauses on rate-limit answers stay.
   */
  learn?: boolean;
  /** Host (`api.openai.com`, or `host:port`) to its token budget, for language-model APIs. */
  llm?: Record<string, Budget>;
}

/** `fetch`'s options, this request's priority, and a model call's own count of its input tokens. */
export interface TollgateRequestInit extends RequestInit {
  tollgate?: { priority?: Priority; inputTokens?: number };
}

/** A `fetch` that takes each mapped host's quota first. */
export type TollgateFetch = (input: string | URL | Request, init?: TollgateRequestInit) => Promise<Response>;

/** Sleep `seconds`; rejects with the signal's reason if it aborts first. */
function sleep(seconds: number, signal: AbortSignal | null | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, seconds * 1000));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function isStream(body: unknown): boolean {
  return typeof ReadableStream !== "undefined" && body instanceof ReadableStream;
}

function timedOut(host: Host, policy: Policy, paused: boolean, last: RateLimited | null, retryAfter: number): RateLimited {
  return new RateLimited(timedOutMessage(host, policy.waitMax, paused), {
    retryAfter,
    reason: paused ? "paused" : (last?.reason ?? null),
    limits: last?.limits ?? [],
    status: last?.status ?? null,
  });
}

/** Make a {@link TollgateFetch} (see the module documentation). */
export function tollgateFetch(options: TollgateFetchOptions): TollgateFetch {
  const { client } = options;
  const inner = options.fetch ?? globalThis.fetch;
  const llm = options.llm ?? {};
  const policy = new Policy(options, Object.keys(llm).length === 0);
  const learn = options.learn ?? true;
  if (typeof learn !== "boolean") {
    throw new TypeError(`learn: true or false, got ${JSON.stringify(learn)}`);
  }
  /**
   * Per limit taught: the quotas last taught (as JSON), when (monotonic seconds), and whether
   * the server has yet to take them.
   */
  const taught = new Map<string, { quotas: string; at: number; pending: boolean }>();
  const warn =
    options.onWarning ??
    ((message: string, error: unknown): void => {
      process.emitWarning(`${message}: ${error instanceof Error ? error.message : String(error)}`, "TollgateWarning");
    });

  /**
   * Wait for leave to send one attempt: no pause known, one unit of the host's limits. Also
   * when the grant's answer came (monotonic seconds).
   */
  async function admit(
    host: Host,
    priority: Priority,
    signal: AbortSignal | null,
  ): Promise<{ permit: Permit; grantedAt: number }> {
    const deadline = monotonic() + policy.waitMax;
    let last: RateLimited | null = null;
    for (;;) {
      const left = policy.pausedFor(host);
      if (left > 0) {
        const resumeAt = monotonic() + left + policy.jitter();
        if (resumeAt >= deadline) {
          throw timedOut(host, policy, true, last, resumeAt - monotonic());
        }
        await sleep(resumeAt - monotonic(), signal);
      }
      const remaining = deadline - monotonic();
      if (remaining <= 0) {
        throw timedOut(host, policy, false, last, 0);
      }
      let permit: Permit;
      let grantedAt: number;
      try {
        permit = await client.acquire(host.names, { priority, wait: remaining });
        // From the answer's arrival, not from here: reading it and the work queued meanwhile
        // are part of the delay the vendor sees.
        grantedAt = permit.grantedAt;
      } catch (error) {
        if (!(error instanceof RateLimited)) {
          throw error;
        }
        last = error;
        if (error.reason === "paused") {
          policy.notePause(host.pauseTarget, monotonic() + error.retryAfter);
        }
        const left = deadline - monotonic();
        if (left <= 0.001) {
          throw timedOut(host, policy, false, last, error.retryAfter);
        }
        await sleep(Math.min(Math.max(error.retryAfter, ASK_INTERVAL_MIN), left), signal);
        continue;
      }
      if (policy.pausedFor(host) > 0) {
        // Granted, but a pause began since: give the unit back, wait with the others.
        await permit.commit(0).catch(() => undefined);
        continue;
      }
      return { permit, grantedAt };
    }
  }

  /** Pause the host here at once, then fleet-wide through the server. */
  async function pauseHost(host: Host, retryAfter: number | null): Promise<void> {
    const pause = policy.pauseFor(retryAfter);
    if (pause === null) {
      return;
    }
    policy.notePause(host.pauseTarget, monotonic() + pause);
    try {
      const left = await client.pause(host.pauseTarget, { seconds: pause });
      policy.notePause(host.pauseTarget, monotonic() + left);
    } catch (error) {
      if (!(error instanceof TollgateError)) {
        throw error;
      }
      warn(
        `could not pause ${host.pauseTarget} on the Tollgate server; other processes will learn of the vendor's limit from the vendor`,
        error,
      );
    }
  }

  /**
   * Teach the server what the vendor's answer says of the host's first limit, when that is
   * news (see the module documentation); note the pause it answers with. Never throws.
   */
  async function teach(host: Host, url: URL, status: number, advice: Advice | null, rateLimited: boolean): Promise<void> {
    const quotas: Quota[] = (advice?.quotas ?? [])
      .filter((item) => item.quota <= QUOTA_MAX && (item.windowMs ?? 0) <= WINDOW_MS_MAX)
      .map((item) => ({ quota: item.quota, ...(item.windowMs === null ? {} : { window: item.windowMs / 1000 }) }));
    // A refusal says something of the limit only when the vendor did not say it itself.
    const refused = rateLimited && quotas.length === 0;
    const key = JSON.stringify(quotas);
    const last = taught.get(host.pauseTarget);
    const now = monotonic();
    const news =
      refused ||
      advice?.remaining === 0 ||
      (quotas.length > 0 &&
        (last === undefined || last.quotas !== key || last.pending || now - last.at > LESSON_REFRESH));
    if (!news) {
      return;
    }
    // Quotas on their way to the server are taught again by every call that reads them, each
    // waiting for the answer, rather than asking for its next grant under the limit the vendor
    // just refused.
    const entry = { quotas: key, at: now, pending: quotas.length > 0 };
    taught.set(host.pauseTarget, entry);
    const from = advice === null ? `HTTP ${status}` : `${advice.family} headers`;
    const lesson: Lesson = {
      source: `${from} from ${url.host}`.slice(0, SOURCE_BYTES_MAX),
      quotas,
      ...(advice?.remaining == null ? {} : { remaining: advice.remaining }),
      ...(advice?.resetMs == null ? {} : { reset: advice.resetMs / 1000 }),
      ...(refused ? { rateLimited: true } : {}),
    };
    try {
      const answer = await client.learn(host.pauseTarget, lesson);
      entry.pending = false;
      if (answer.paused > 0) {
        policy.notePause(host.pauseTarget, monotonic() + answer.paused);
      }
    } catch (error) {
      debug("lesson for %s not taken: %s", host.pauseTarget, error instanceof Error ? error.message : String(error));
    }
  }

  /**
   * The call happened (or may have): its unit stays used; a lease is released. `sentAfter`:
   * seconds from the grant to the request's leaving, reported when learning.
   */
  async function settle(permit: Permit, sentAfter?: number): Promise<void> {
    try {
      if (sentAfter === undefined) {
        await permit.commit();
        return;
      }
      try {
        await permit.commit(undefined, { sentAfter: Math.min(sentAfter, SENT_AFTER_MAX) });
      } catch (error) {
        if (!(error instanceof BadRequest)) {
          throw error;
        }
        // A server that does not take the delay still takes the commit itself.
        debug("commit with sent_after_ms refused: %s", error.message);
        await permit.commit();
      }
    } catch (error) {
      if (!(error instanceof TollgateError)) {
        throw error;
      }
      // The lease runs to its TTL.
    }
  }

  const fetchWithQuota: TollgateFetch = async (input, init) => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const host = policy.hostFor(url);
    if (host === undefined) {
      return inner(input, init);
    }
    const priority = init?.tollgate?.priority ?? policy.priority;
    const request = new Request(input, init);
    // A body given as a stream is read as it is sent: there is no second copy to send.
    const mayReplay = !isStream(init?.body);
    const retryTransient = mayReplay && idempotent(request.method);
    let attempt = 0;
    for (;;) {
      const { permit, grantedAt } = await admit(host, priority, request.signal);
      const sending = mayReplay ? request.clone() : request;
      const sentAfter = learn ? monotonic() - grantedAt : undefined;
      let response: Response;
      try {
        response = await inner(sending);
      } catch (error) {
        await settle(permit, sentAfter);
        if (retryTransient && transient(error) && attempt < policy.retriesMax) {
          await sleep(policy.backoff(attempt), request.signal);
          attempt += 1;
          continue;
        }
        throw error;
      }
      let verdict = policy.classify(response);
      if (verdict.kind === "retry" && !retryTransient) {
        verdict = Verdict.done();
      }
      if (verdict.kind === "rate_limited") {
        await pauseHost(host, verdict.retryAfter);
      }
      if (learn) {
        await teach(host, url, response.status, readAdvice(response.headers, Date.now()), verdict.kind === "rate_limited");
      }
      await settle(permit, sentAfter);
      if (verdict.kind === "done" || attempt >= policy.retriesMax || !mayReplay) {
        return response;
      }
      // Not awaited: the body of a cloned (teed) response is cancelled only once every copy is.
      void response.body?.cancel().catch(() => undefined);
      if (verdict.kind === "retry") {
        await sleep(policy.backoff(attempt), request.signal);
      }
      attempt += 1;
    }
  };
  if (Object.keys(llm).length === 0) return fetchWithQuota;
  // Model calls take their tokens first, then go through the host's quota and pauses above.
  return llmFetch({ client, hosts: llm, fetch: fetchWithQuota as typeof fetch });
}
