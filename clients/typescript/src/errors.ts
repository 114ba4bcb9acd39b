/**
 * The errors a Tollgate server answers with, one class per wire code, all under
 * {@link TollgateError}.
 *
 * Every error answer of the server is `{"error": {"code", "message", "field"?}, ...}`. The code
 * picks the class; `field` names the request field at fault (for `bad_request`). A denial
 * (`429 rate_limited`) also carries when to retry and the state of the limits.
 */

import { type Fields, isObject, type LimitStatus, limitStatuses } from "./models.js";
import * as Wire from "./wire.js";

/** Why a request was not granted. */
export type DenyReason = Wire.RateLimitedBody["reason"];

/** What every error is constructed with besides its message. */
export interface ErrorFields {
  code?: string;
  field?: string | null;
  status?: number | null;
  cause?: unknown;
}

/**
 * A request to the Tollgate server failed.
 *
 * `code` is the server's wire code (`bad_request`, `not_found`, ...), `field` the request field
 * at fault when the server names one (else `null`), and `status` the HTTP status (`null` when
 * no answer arrived).
 */
export class TollgateError extends Error {
  /** The wire code this class stands for. */
  static readonly code: string = "internal";
  readonly code: string;
  readonly field: string | null;
  readonly status: number | null;

  constructor(message: string, fields: ErrorFields = {}) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    const own = new.target as typeof TollgateError;
    this.name = own.name;
    this.code = fields.code ?? own.code;
    this.field = fields.field ?? null;
    this.status = fields.status ?? null;
  }
}

/** The server refused the request as malformed; `field` names the field at fault. */
export class BadRequest extends TollgateError {
  static override readonly code = "bad_request";
}

/** The bearer token is missing or wrong (or the admin API is disabled on the server). */
export class Unauthorized extends TollgateError {
  // Widened: `Forbidden` extends it with a code of its own.
  static override readonly code: string = "unauthorized";
}

/**
 * The token is valid but its scope does not allow this: a limit outside its limits, a priority
 * above its `priority_max`, or a pause it may not make. The message names which. A subclass of
 * {@link Unauthorized}, which servers before `forbidden` answered these with.
 */
export class Forbidden extends Unauthorized {
  static override readonly code = "forbidden";
}

/** Unknown limit, unknown (or forged) permit, or unknown endpoint. */
export class NotFound extends TollgateError {
  static override readonly code = "not_found";
}

/** What a {@link RateLimited} is constructed with besides its message. */
export interface RateLimitedFields extends ErrorFields {
  /** When to try again, in seconds. */
  retryAfter: number;
  reason?: DenyReason | null;
  limits?: LimitStatus[];
}

/**
 * Not granted within the wait.
 *
 * `retryAfter` is when to try again, in seconds; `reason` is `capacity`, `paused`,
 * `recovering` or `queued` (`null` if the answer did not say); `limits` holds the state of each
 * limit asked for.
 */
export class RateLimited extends TollgateError {
  static override readonly code = "rate_limited";
  readonly retryAfter: number;
  readonly reason: DenyReason | null;
  readonly limits: LimitStatus[];

  constructor(message: string, fields: RateLimitedFields) {
    super(message, { status: 429, ...fields });
    this.retryAfter = fields.retryAfter;
    this.reason = fields.reason ?? null;
    this.limits = fields.limits ?? [];
  }
}

/**
 * The server's store or rules database cannot be reached, or the server is stopping.
 * Transient: the same request may succeed later or on another replica.
 */
export class StoreUnavailable extends TollgateError {
  static override readonly code = "store_unavailable";
}

/** The server tracks as many counters as it is configured to (`keys_tracked_max`). */
export class TooManyKeys extends TollgateError {
  static override readonly code = "too_many_keys";
}

/** The permit was committed already or expired, or a rate permit was renewed. */
export class Conflict extends TollgateError {
  static override readonly code = "conflict";
}

/** The server failed (code `internal`), or answered something that is not Tollgate's. */
export class ServerError extends TollgateError {
  static override readonly code = "internal";
}

/**
 * No answer from the server: connection refused, reset, or timed out. Its code,
 * `unreachable`, is the client's own; the server never sends it. The failure of `fetch` is the
 * `cause`.
 */
export class ServerUnreachable extends TollgateError {
  static override readonly code = "unreachable";
}

const BY_CODE: ReadonlyMap<string, typeof TollgateError> = new Map(
  [BadRequest, Unauthorized, Forbidden, NotFound, RateLimited, StoreUnavailable, TooManyKeys, Conflict, ServerError].map(
    (kind) => [kind.code, kind],
  ),
);

// An answer without Tollgate's error body (a proxy in front of the server, say) is classed by
// its status alone.
const BY_STATUS: ReadonlyMap<number, typeof TollgateError> = new Map<number, typeof TollgateError>([
  [400, BadRequest],
  [401, Unauthorized],
  [403, Forbidden],
  [404, NotFound],
  [405, BadRequest],
  [409, Conflict],
  [429, RateLimited],
  [503, StoreUnavailable],
]);

/** `Retry-After` in whole seconds, or 0 when there is none that can be read. */
function retryAfterHeader(headers: Headers): number {
  const value = headers.get("retry-after")?.trim() ?? "";
  return /^[0-9]+$/.test(value) ? Number(value) : 0;
}

function asReason(value: unknown): DenyReason | null {
  return (Wire.DENY_REASONS as readonly unknown[]).includes(value) ? (value as DenyReason) : null;
}

/** The error an answer of status 400 or above stands for, from its status, headers and body. */
export function errorFromAnswer(status: number, headers: Headers, text: string): TollgateError {
  let body: unknown = null;
  try {
    body = JSON.parse(text);
  } catch {
    body = null;
  }
  const detail = isObject(body) ? (body as Fields<Wire.ErrorBody>).error : undefined;
  const code = isObject(detail) ? (detail as Fields<Wire.ErrorDetail>).code : undefined;
  if (!isObject(body) || !isObject(detail) || typeof code !== "string") {
    const kind = BY_STATUS.get(status) ?? (status < 500 ? BadRequest : ServerError);
    const shown = text.slice(0, 200).trim() || "(empty)";
    const message = `HTTP ${status} without a Tollgate error body: ${shown}`;
    if (kind === RateLimited) {
      return new RateLimited(message, { retryAfter: retryAfterHeader(headers), status });
    }
    return new kind(message, { status });
  }
  const said: Fields<Wire.ErrorDetail> = detail;
  const message = typeof said.message === "string" ? said.message : `HTTP ${status}`;
  const field = typeof said.field === "string" ? said.field : null;
  const kind = BY_CODE.get(code) ?? (status >= 500 ? ServerError : TollgateError);
  if (kind === RateLimited) {
    const denied: Fields<Wire.RateLimitedBody> = body;
    return new RateLimited(message, {
      retryAfter: typeof denied.retry_after_ms === "number" ? denied.retry_after_ms / 1000 : retryAfterHeader(headers),
      reason: asReason(denied.reason),
      limits: limitStatuses(denied.limits),
      code,
      field,
      status,
    });
  }
  return new kind(message, { code, field, status });
}
