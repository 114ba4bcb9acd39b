/**
 * Client of the Tollgate rate-limit and quota server.
 *
 * ```ts
 * import { Client } from "@tollgate/client";
 *
 * const tollgate = new Client(); // TOLLGATE_SERVER, else http://127.0.0.1:7070
 * const permit = await tollgate.acquire("vendor-x", { wait: 5 });
 * try {
 *   await callTheVendor();
 * } finally {
 *   await permit.commit();
 * }
 * ```
 *
 * Every failure the server answers with is a {@link TollgateError} subclass carrying `code`,
 * `message`, `field` and `status`. {@link tollgateFetch} makes a `fetch` that takes a vendor's
 * quota before each request and pauses the whole fleet when the vendor says "retry after".
 * Durations are in seconds throughout.
 */

export {
  type AcquireOptions,
  type ChargeOptions,
  type CheckRequest,
  type CheckResult,
  Client,
  type CommitOptions,
  type ClientOptions,
  DEFAULT_TIMEOUT,
  DEFAULT_URL,
  type LimitList,
  LimitsAdmin,
  type PauseOptions,
  Permit,
} from "./client.js";
export {
  type Classifier,
  defaultVerdict,
  parseRetryAfter,
  type PolicyOptions,
  RETRIES_MAX_LIMIT,
  RETRY_AFTER_BYTES_MAX,
  Verdict,
} from "./dispatch.js";
export {
  BadRequest,
  Conflict,
  type DenyReason,
  type ErrorFields,
  Forbidden,
  NotFound,
  RateLimited,
  type RateLimitedFields,
  ServerError,
  ServerUnreachable,
  StoreUnavailable,
  TollgateError,
  TooManyKeys,
  Unauthorized,
} from "./errors.js";
export { type TollgateFetch, tollgateFetch, type TollgateFetchOptions, type TollgateRequestInit } from "./fetch.js";
export {
  type Api,
  type Budget,
  type CustomApi,
  type Estimate,
  estimate,
  llmFetch,
  type LlmFetchOptions,
  type LlmRequestInit,
  type Reader,
  recognise,
  type Usage,
  UsageReader,
} from "./llm.js";
export type {
  Charged,
  Committed,
  Costs,
  LearnedLimit,
  Learnt,
  Lesson,
  Limits,
  LimitStatus,
  Priority,
  Quota,
} from "./models.js";
export {
  ADVICE_QUOTAS_MAX,
  ADVICE_VALUE_BYTES_MAX,
  type Advice,
  type AdviceFamily,
  type AdvisedQuota,
  readAdvice,
} from "./vendor.js";
export type {
  ConcurrencyRule,
  LimitRule,
  Match,
  RateRule,
  RejectedRow,
  Reserve,
  StoredLimit,
} from "./wire.js";
