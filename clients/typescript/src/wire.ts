/**
 * The JSON bodies of HTTP API v1 as the client sends and reads them, field for field as the
 * server spells them (milliseconds, snake_case). Everything else in the package works in
 * seconds and camelCase and converts at this boundary (`models.ts`).
 *
 * The server's `/openapi.json` is the contract; `test/wire/check.ts` holds these types to it:
 * every body sent must be one the document accepts, every answer the document describes must
 * be readable as the type here, and no field named here may be missing from the document.
 */

import type { Priority } from "./models.js";

/** `POST /v1/acquire`. */
export interface AcquireBody {
  limits: string[];
  key?: string;
  cost: number;
  /** Units of some limits by name, where they differ from `cost`. */
  costs?: Record<string, number>;
  priority: Priority;
  wait_ms: number;
}

/** One limit's state after a decision. */
export interface LimitView {
  name: string;
  remaining: number;
  reset_ms: number;
  fence?: number | null;
  expires_ms?: number | null;
}

/** 200 from `/v1/acquire`. */
export interface Granted {
  permit: string;
  limits: LimitView[];
}

/** The `error` object of every error answer. */
export interface ErrorDetail {
  code: string;
  message: string;
  field?: string;
}

/** Any error answer: `{"error": {...}}`. */
export interface ErrorBody {
  error: ErrorDetail;
}

/**
 * Every reason a request is not granted, as the server spells it: the one list the client
 * keeps, held to the server's /openapi.json by test/wire/check.ts.
 */
export const DENY_REASONS = ["capacity", "paused", "queued", "recovering"] as const;

/** 429 from `/v1/acquire`. */
export interface RateLimitedBody {
  error: ErrorDetail;
  retry_after_ms: number;
  reason: (typeof DENY_REASONS)[number];
  limits: LimitView[];
}

/** `POST /v1/permits/{permit}/commit`. */
export interface CommitBody {
  /** One number for every rate limit of the permit, or each rate limit's own by name. */
  used: number | Record<string, number>;
  /** From the grant's answer reaching the client to the request leaving for the vendor. */
  sent_after_ms?: number;
}

/** `POST /v1/charge`: units spent beyond any grant, counted even past the limits. */
export interface ChargeBody {
  limits: string[];
  key?: string;
  cost?: number;
  costs?: Record<string, number>;
}

/** One limit after a charge. */
export interface ChargedView {
  name: string;
  charged: number;
  used: number;
  reset_ms: number;
}

/** 200 from `/v1/charge`. */
export interface ChargeAnswer {
  limits: ChargedView[];
}

/** 200 from a commit. */
export interface CommitAnswer {
  refunded: number;
  released: number;
}

/** 200 from `/v1/permits/{permit}/renew`. */
export interface RenewAnswer {
  expires_ms: number;
}

/** `POST /v1/pause`. */
export interface PauseBody {
  limit: string;
  key?: string;
  retry_after_ms: number;
}

/** 200 from `/v1/pause`. */
export interface PauseAnswer {
  limit: string;
  key?: string | null;
  paused_ms: number;
}

/** One quota a vendor advertises: `quota` calls per `window_ms`. */
export interface LearnQuota {
  quota: number;
  window_ms?: number;
}

/** `POST /v1/learn`: what a vendor's answer said of its limits. */
export interface LearnBody {
  limit: string;
  source: string;
  quotas: LearnQuota[];
  remaining?: number;
  reset_ms?: number;
  rate_limited?: boolean;
}

/** The limit the server learned, while it holds. */
export interface Learned {
  limit: number;
  /** `advertised` or `rate_limited`. */
  kind: string;
  source: string;
  expires_in_ms: number;
}

/** 200 from `/v1/learn`. */
export interface LearnAnswer {
  limit: string;
  configured: number;
  effective: number;
  paused_ms: number;
  learned?: Learned | null;
  /** The most grant-to-send delay reported lately, and the margin learned from it. */
  delay_ms?: number;
  margin_ms?: number;
}

/** `POST /v1/check`. */
export interface CheckBody {
  user?: string;
  method: string;
  path: string;
}

/** 200 from `/v1/check`. */
export interface CheckAnswer {
  allowed: boolean;
  path: string;
  matched: string[];
  permit?: string | null;
  limits: LimitView[];
}

/** 429 from `/v1/check`. */
export interface CheckDenied extends RateLimitedBody {
  allowed: boolean;
  path: string;
  matched: string[];
}

/** Units kept for a priority and those above it. */
export interface Reserve {
  high?: number | null;
  normal?: number | null;
}

/** The requests an inbound limit applies to. */
export interface Match {
  method: string;
  path: string;
}

/** The fields both kinds of limit take. */
interface RuleFields {
  /** Optional; when given, the name in the path. */
  name?: string | null;
  /** Units per period (rate) or leases outstanding (concurrency). */
  limit: number;
  reserve?: Reserve | null;
  /** A label (`user`): each key given at acquire time gets its own counter. */
  per?: string | null;
  /** With `per`: keys tracked at once at most. */
  keys_max?: number | null;
  match?: Match | null;
}

/** At most `limit` units per `period_ms`. */
export interface RateRule extends RuleFields {
  kind: "rate";
  period_ms: number;
  algorithm?: "sliding" | "fixed" | "gcra" | null;
  burst?: number | null;
  margin_ms?: number | null;
}

/** At most `limit` leases at once; a lease not renewed within `lease_ttl_ms` expires. */
export interface ConcurrencyRule extends RuleFields {
  kind: "concurrency";
  lease_ttl_ms: number;
}

/** The body of `PUT /v1/limits/{name}`, in the server's field names. */
export type LimitRule = RateRule | ConcurrencyRule;

/** A limit as the server stores it (`GET /v1/limits/{name}`), defaults filled in. */
export interface StoredLimit {
  name?: string | null;
  kind?: string | null;
  limit?: number | null;
  period_ms?: number | null;
  algorithm?: string | null;
  burst?: number | null;
  margin_ms?: number | null;
  lease_ttl_ms?: number | null;
  reserve?: Reserve | null;
  per?: string | null;
  keys_max?: number | null;
  match?: { method?: string | null; path?: string | null } | null;
}

/** A row of the rules table that failed validation. */
export interface RejectedRow {
  name: string;
  column: string;
  reason: string;
  previous_in_force: boolean;
  line?: number | null;
}

/** 200 from `GET /v1/limits`. */
export interface LimitList {
  version: number;
  limits: StoredLimit[];
  rejected: RejectedRow[];
}
