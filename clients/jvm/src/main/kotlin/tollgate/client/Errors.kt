package tollgate.client

import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds
import kotlin.time.toJavaDuration

/**
 * A request to the Tollgate server failed: one subclass per wire code.
 *
 * [code] is the server's wire code (`bad_request`, `not_found`, ...), [field] the request field
 * at fault when the server names one, [status] the HTTP status (null when no answer arrived).
 */
open class TollgateException(
    message: String,
    val code: String,
    val field: String? = null,
    val status: Int? = null,
    cause: Throwable? = null,
) : RuntimeException(message, cause)

/** The server refused the request as malformed; [field] names the field at fault. */
class BadRequest(message: String, field: String? = null, status: Int? = 400) :
    TollgateException(message, "bad_request", field, status)

/** The bearer token is missing or wrong (or the admin API is disabled on the server). */
open class Unauthorized(message: String, code: String = "unauthorized", field: String? = null, status: Int? = 401) :
    TollgateException(message, code, field, status)

/**
 * The token is valid but its scope does not allow this (a limit outside it, a priority above
 * its `priority_max`, a pause it may not make). A subclass of [Unauthorized], which servers
 * before `forbidden` answered these with.
 */
class Forbidden(message: String, field: String? = null, status: Int? = 403) :
    Unauthorized(message, "forbidden", field, status)

/** Unknown limit, unknown (or forged) permit, or unknown endpoint. */
class NotFound(message: String, field: String? = null, status: Int? = 404) :
    TollgateException(message, "not_found", field, status)

/**
 * Not granted within the wait. [retryAfter] is when to try again; [reason] is `capacity`,
 * `paused`, `recovering` or `queued` (null if the answer did not say); [limits] the state of
 * each limit asked for.
 */
class RateLimited(
    message: String,
    val retryAfter: Duration,
    val reason: String? = null,
    val limits: List<LimitStatus> = emptyList(),
    field: String? = null,
    status: Int? = 429,
) : TollgateException(message, "rate_limited", field, status) {
    /** [retryAfter] for Java. */
    fun retryAfterDuration(): java.time.Duration = retryAfter.toJavaDuration()
}

/**
 * The server's store or rules database cannot be reached, or the server is stopping.
 * Transient: the same request may succeed later or on another replica.
 */
class StoreUnavailable(message: String, field: String? = null, status: Int? = 503) :
    TollgateException(message, "store_unavailable", field, status)

/** The server tracks as many counters as it may (`keys_tracked_max`, or a limit's `keys_max`). */
class TooManyKeys(message: String, field: String? = null, status: Int? = 503) :
    TollgateException(message, "too_many_keys", field, status)

/** The permit was committed already or expired, or a rate permit was renewed. */
class Conflict(message: String, field: String? = null, status: Int? = 409) :
    TollgateException(message, "conflict", field, status)

/** The server failed (code `internal`), or answered something that is not Tollgate's. */
class ServerError(message: String, field: String? = null, status: Int? = 500, code: String = "internal") :
    TollgateException(message, code, field, status)

/**
 * No answer from the server: connection refused, reset, or timed out. Its code,
 * `unreachable`, is the client's own; the server never sends it.
 */
class ServerUnreachable(message: String, cause: Throwable? = null) :
    TollgateException(message, "unreachable", null, null, cause)

/** The reasons a denial may give. */
internal val DENY_REASONS = setOf("capacity", "paused", "recovering", "queued")

/** `Retry-After` in whole seconds, or zero when it cannot be read. */
private fun retryAfterHeader(value: String?): Duration {
    val text = value?.trim() ?: return Duration.ZERO
    return if (text.isNotEmpty() && text.length <= 12 && text.all { it in '0'..'9' }) text.toLong().seconds else Duration.ZERO
}

/** The error an answer of status 400 or above stands for, from its status, headers and body. */
internal fun errorFromAnswer(status: Int, retryAfter: String?, text: String): TollgateException {
    val body = try {
        Json.read(text) as? Map<*, *>
    } catch (_: IllegalArgumentException) {
        null
    }
    val detail = body?.get("error") as? Map<*, *>
    val code = detail?.get("code") as? String
    if (body == null || detail == null || code == null) {
        val shown = text.take(200).trim().ifEmpty { "(empty)" }
        val message = "HTTP $status without a Tollgate error body: $shown"
        // An answer without Tollgate's error body (a proxy in front of it) is classed by status.
        return when (status) {
            400, 405 -> BadRequest(message, status = status)
            401 -> Unauthorized(message, status = status)
            403 -> Forbidden(message, status = status)
            404 -> NotFound(message, status = status)
            409 -> Conflict(message, status = status)
            429 -> RateLimited(message, retryAfterHeader(retryAfter), status = status)
            503 -> StoreUnavailable(message, status = status)
            else -> if (status < 500) BadRequest(message, status = status) else ServerError(message, status = status)
        }
    }
    val message = detail["message"] as? String ?: "HTTP $status"
    val field = detail["field"] as? String
    return when (code) {
        "bad_request" -> BadRequest(message, field, status)
        "unauthorized" -> Unauthorized(message, field = field, status = status)
        "forbidden" -> Forbidden(message, field, status)
        "not_found" -> NotFound(message, field, status)
        "rate_limited" -> {
            val ms = (body["retry_after_ms"] as? Number)?.toDouble()
            RateLimited(
                message,
                ms?.milliseconds ?: retryAfterHeader(retryAfter),
                (body["reason"] as? String)?.takeIf { it in DENY_REASONS },
                limitStatuses(body["limits"]),
                field,
                status,
            )
        }
        "store_unavailable" -> StoreUnavailable(message, field, status)
        "too_many_keys" -> TooManyKeys(message, field, status)
        "conflict" -> Conflict(message, field, status)
        "internal" -> ServerError(message, field, status)
        else -> if (status >= 500) ServerError(message, field, status, code) else TollgateException(message, code, field, status)
    }
}
