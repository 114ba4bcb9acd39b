package tollgate.client

import kotlin.math.ceil
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.toJavaDuration

/** A request's priority: a lower level never delays a higher one. */
enum class Priority(val wire: String) {
    HIGH("high"),
    NORMAL("normal"),
    LOW("low"),
}

/**
 * One limit's state after a decision: [remaining] units open to the request's priority,
 * [resetAfter] until everything counted now stops counting; leases also carry [fence] (grows
 * with each grant) and [expiresAfter].
 */
data class LimitStatus(
    val name: String,
    val remaining: Long,
    val resetAfter: Duration,
    val fence: Long? = null,
    val expiresAfter: Duration? = null,
) {
    fun resetAfterDuration(): java.time.Duration = resetAfter.toJavaDuration()
}

/** What a commit gave back: rate units refunded and leases released. */
data class Committed(val refunded: Long, val released: Long)

/** The limits in force, the rules' version, and the rows that failed validation. */
data class LimitList(val version: Long, val limits: List<Map<String, Any?>>, val rejected: List<Map<String, Any?>>)

/**
 * The answer to "may this inbound request proceed?" (`/v1/check`): [path] as normalized,
 * [matched] the limits that applied; when denied, [retryAfter] and [reason]; when allowed and a
 * concurrency limit applied, [permit] holds the lease to commit once the request is done.
 */
data class CheckResult(
    val allowed: Boolean,
    val path: String,
    val matched: List<String>,
    val limits: List<LimitStatus>,
    val retryAfter: Duration? = null,
    val reason: String? = null,
    val permit: Permit? = null,
)

/**
 * A limit's rule as the admin API takes it, in the server's field names (`kind`, `limit`,
 * `period_ms`, `algorithm`, `burst`, `margin_ms`, `lease_ttl_ms`, `reserve`, `per`,
 * `keys_max`, `match`).
 */
class LimitRule private constructor(val fields: Map<String, Any?>) {
    /** This rule with one more field (a field the server does not know is its `bad_request`). */
    fun with(field: String, value: Any?): LimitRule = LimitRule(fields + (field to value))

    companion object {
        /** `limit` units per `period`. */
        @JvmStatic
        fun rate(limit: Long, period: java.time.Duration): LimitRule =
            LimitRule(mapOf("kind" to "rate", "limit" to limit, "period_ms" to period.toMillis()))

        /** At most `limit` leases at once, each ending after `leaseTtl` unless renewed. */
        @JvmStatic
        fun concurrency(limit: Long, leaseTtl: java.time.Duration): LimitRule =
            LimitRule(mapOf("kind" to "concurrency", "limit" to limit, "lease_ttl_ms" to leaseTtl.toMillis()))

        /** Any fields, as given. */
        @JvmStatic
        fun of(fields: Map<String, Any?>): LimitRule = LimitRule(LinkedHashMap(fields))
    }
}

/** One quota a vendor advertises: [quota] calls per [window] (null: not said). */
data class Quota(val quota: Long, val window: Duration? = null)

/** What a vendor's answer said of its limits, to teach the server ([TollgateClient.learn]). */
data class Lesson(
    val source: String,
    val quotas: List<Quota> = emptyList(),
    val remaining: Long? = null,
    val reset: Duration? = null,
    val rateLimited: Boolean = false,
)

/** The server's answer to a lesson: the limit configured and in force, and any pause. */
data class Learnt(val limit: String, val configured: Long, val effective: Long, val paused: Duration)

internal fun limitStatuses(raw: Any?): List<LimitStatus> =
    (raw as? List<*>).orEmpty().filterIsInstance<Map<*, *>>().map { item ->
        LimitStatus(
            name = (item["name"] ?: "").toString(),
            remaining = (item["remaining"] as? Number)?.toLong() ?: 0,
            resetAfter = ((item["reset_ms"] as? Number)?.toDouble() ?: 0.0).milliseconds,
            fence = (item["fence"] as? Number)?.toLong(),
            expiresAfter = (item["expires_ms"] as? Number)?.toDouble()?.milliseconds,
        )
    }

/** A duration as whole milliseconds, rounded up: a wait or a pause is never shortened. */
internal fun wholeMillis(value: Duration, what: String): Long {
    require(!value.isNegative()) { "$what: must be at least 0, got $value" }
    require(value.isFinite()) { "$what: must be finite" }
    val nanos = value.inWholeNanoseconds
    return if (nanos == Long.MAX_VALUE) value.inWholeMilliseconds else ceil(nanos / 1_000_000.0).toLong()
}

internal fun limitNames(limits: Collection<String>): List<String> {
    require(limits.isNotEmpty()) { "limits: name at least one limit" }
    return limits.toList()
}
