package tollgate.client

import java.time.LocalDate
import java.time.LocalDateTime
import java.time.ZoneOffset
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.ThreadLocalRandom
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.nanoseconds
import kotlin.time.Duration.Companion.seconds

/**
 * The vendor-call protocol of the dispatcher, free of I/O: reading `Retry-After`, classifying
 * a vendor's answer, the bounds on pauses and retries, and what this process knows of pauses
 * in force.
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
 * The same rules as tollgate-dispatch's and the Python and TypeScript clients', held to the
 * same test vectors (`crates/dispatch/tests/vectors/retry_after.json`).
 */
object RetryAfter {
    /** Longest `Retry-After` value read, in bytes; an HTTP-date is 29. */
    const val BYTES_MAX = 64

    /** Delta-seconds beyond this saturate: the vendor asked for a long wait, capped later. */
    const val DELTA_SECONDS_MAX = Long.MAX_VALUE

    private val MONTHS = listOf("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
    private const val DAYS = "(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
    private const val LONG_DAYS = "(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
    private val MONTH = "(" + MONTHS.joinToString("|") + ")"
    private const val TIME = "([0-9]{2}):([0-9]{2}):([0-9]{2})"

    // RFC 9110 section 5.6.7: the preferred form, then the two obsolete ones.
    private val IMF_FIXDATE = Regex("$DAYS, ([0-9]{2}) $MONTH ([0-9]{4}) $TIME GMT")
    private val RFC850_DATE = Regex("$LONG_DAYS, ([0-9]{2})-$MONTH-([0-9]{2}) $TIME GMT")
    private val ASCTIME_DATE = Regex("$DAYS $MONTH ( [0-9]|[0-9]{2}) $TIME ([0-9]{4})")

    /** Seconds since the epoch of a date's parts, or null if they name no such moment. */
    private fun utcSeconds(year: Int, month: Int, day: Int, hour: Int, minute: Int, second: Int): Long? {
        if (hour > 23 || minute > 59 || second > 59) return null
        return try {
            LocalDateTime.of(LocalDate.of(year, month, day), java.time.LocalTime.of(hour, minute, second)).toEpochSecond(ZoneOffset.UTC)
        } catch (_: java.time.DateTimeException) {
            null
        }
    }

    private fun httpDate(text: String, now: Long): Long? {
        IMF_FIXDATE.matchEntire(text)?.destructured?.let { (day, month, year, hour, minute, second) ->
            return utcSeconds(year.toInt(), MONTHS.indexOf(month) + 1, day.toInt(), hour.toInt(), minute.toInt(), second.toInt())
        }
        RFC850_DATE.matchEntire(text)?.destructured?.let { (day, month, shortYear, hour, minute, second) ->
            // A two-digit year more than 50 years ahead is the latest such year in the past.
            val thisYear = java.time.Instant.ofEpochSecond(now).atZone(ZoneOffset.UTC).year
            val centuryYear = thisYear - thisYear % 100 + shortYear.toInt()
            val year = if (centuryYear > thisYear + 50) centuryYear - 100 else centuryYear
            return utcSeconds(year, MONTHS.indexOf(month) + 1, day.toInt(), hour.toInt(), minute.toInt(), second.toInt())
        }
        ASCTIME_DATE.matchEntire(text)?.destructured?.let { (month, day, hour, minute, second, year) ->
            return utcSeconds(year.toInt(), MONTHS.indexOf(month) + 1, day.trim().toInt(), hour.toInt(), minute.toInt(), second.toInt())
        }
        return null
    }

    /**
     * The wait a `Retry-After` value asks for, in whole seconds, measured from `now` (seconds
     * since the epoch). Whole seconds (`"120"`, saturating at [Long.MAX_VALUE]), or an
     * HTTP-date in any of the three forms HTTP allows (zero if it is past). Anything else
     * (empty, negative, fractional, a malformed date, longer than [BYTES_MAX] bytes) is null,
     * never a guess: the caller falls back to its default.
     */
    @JvmStatic
    @JvmOverloads
    fun parse(value: String, now: Long = System.currentTimeMillis() / 1000): Long? {
        if (wireBytes(value) > BYTES_MAX) return null
        // Optional whitespace around a field value is spaces and tabs (RFC 9110 section 5.6.3).
        val text = value.trim(' ', '\t')
        if (text.isEmpty() || text.any { it.code > 0x7f }) return null
        if (text.all { it in '0'..'9' }) return text.toLongOrNull() ?: DELTA_SECONDS_MAX
        val at = httpDate(text, now) ?: return null
        return maxOf(0, at - now)
    }
}

/** A header value's length in bytes on the wire: one a character as HTTP stacks hand them over (Latin-1), else its UTF-8. */
internal fun wireBytes(value: String): Int =
    if (value.all { it.code <= 0xff }) value.length else value.toByteArray(Charsets.UTF_8).size

/**
 * What to do with a vendor's answer: [Done] (hand it to the caller), [Retry] (transient: retry
 * after a backoff) or [RateLimited] (pause the host fleet-wide for `retryAfterSeconds`, or the
 * configured default when null, then retry).
 */
sealed class Verdict {
    object Done : Verdict() {
        override fun toString() = "Done"
    }

    object Retry : Verdict() {
        override fun toString() = "Retry"
    }

    data class RateLimited(val retryAfterSeconds: Long?) : Verdict()

    companion object {
        private val TRANSIENT = setOf(500, 502, 503, 504, 408)

        /** The default classification of an HTTP answer, `retryAfter` its header's value if any. */
        @JvmStatic
        @JvmOverloads
        fun of(status: Int, retryAfter: String?, now: Long = System.currentTimeMillis() / 1000): Verdict {
            val seconds = retryAfter?.let { RetryAfter.parse(it, now) }
            if (status == 429 || (status == 503 && retryAfter != null)) return RateLimited(seconds)
            if (status in TRANSIENT) return Retry
            return Done
        }
    }
}

/** The limits a host's requests take, all or none; pauses go on the first. */
class Host internal constructor(val names: List<String>) {
    val pauseTarget: String get() = names.first()
    override fun toString() = "Host($names)"
}

/**
 * How a dispatcher is configured: `hosts` maps a host (`api.vendor.example`, or
 * `host:port` for one port) to the limits its requests take; the rest have defaults.
 */
data class DispatchOptions @JvmOverloads constructor(
    val hosts: Map<String, List<String>>,
    /** The priority of requests that do not set one. */
    val priority: Priority = Priority.NORMAL,
    /** Longest one attempt waits for quota, pauses included. */
    val waitMax: Duration = 60.seconds,
    /** Retries after the first attempt. */
    val retriesMax: Int = 3,
    /** Wait before retrying a transient failure, doubling up to [backoffMax]. */
    val backoff: Duration = 100.milliseconds,
    val backoffMax: Duration = 5.seconds,
    /** The pause when a vendor's answer gives no readable wait. */
    val retryAfterDefault: Duration = 30.seconds,
    /** The longest pause a vendor can cause. */
    val retryAfterMax: Duration = 900.seconds,
    /** A random extra added to every pause, so that a fleet does not resume in one burst. */
    val resumeJitterMax: Duration = 250.milliseconds,
    /**
     * Teach the server the vendor's rate-limit headers and report each request's
     * grant-to-send delay. Off: neither; pauses on rate-limit answers stay.
     */
    val learn: Boolean = true,
) {
    fun priority(priority: Priority) = copy(priority = priority)
    fun retriesMax(retriesMax: Int) = copy(retriesMax = retriesMax)
    fun learn(learn: Boolean) = copy(learn = learn)
    fun waitMax(waitMax: java.time.Duration) = copy(waitMax = waitMax.toKotlinDuration())
    fun retryAfterDefault(value: java.time.Duration) = copy(retryAfterDefault = value.toKotlinDuration())
    fun retryAfterMax(value: java.time.Duration) = copy(retryAfterMax = value.toKotlinDuration())
    fun resumeJitterMax(value: java.time.Duration) = copy(resumeJitterMax = value.toKotlinDuration())
    fun backoff(base: java.time.Duration, max: java.time.Duration) = copy(backoff = base.toKotlinDuration(), backoffMax = max.toKotlinDuration())

    companion object {
        /** Most retries a dispatcher may be configured for. */
        const val RETRIES_MAX_LIMIT = 100

        /** Longest pause the server takes (a day). */
        val PAUSE_MAX = 86_400.seconds

        /** Options for one host and its limits, for Java. */
        @JvmStatic
        fun of(host: String, vararg limits: String) = DispatchOptions(mapOf(host to limits.toList()))
    }
}

private fun java.time.Duration.toKotlinDuration(): Duration = toNanos().nanoseconds

/** A dispatcher's configuration, checked, its host map, and the pauses this process knows of. */
class Policy(options: DispatchOptions) {
    val hosts: Map<String, Host>
    val priority = options.priority
    val waitMax = seconds("waitMax", options.waitMax, allowZero = false)
    val retriesMax: Int
    private val backoffBase = seconds("backoff", options.backoff)
    private val backoffMax = seconds("backoffMax", options.backoffMax)
    private val retryAfterDefault = seconds("retryAfterDefault", options.retryAfterDefault, allowZero = false)
    private val retryAfterMax = seconds("retryAfterMax", options.retryAfterMax)
    private val resumeJitterMax = seconds("resumeJitterMax", options.resumeJitterMax)
    val learn = options.learn

    /** Per limit: until when (System.nanoTime) this process knows it paused. */
    private val pausedUntil = ConcurrentHashMap<String, Long>()

    init {
        require(options.hosts.isNotEmpty()) { "hosts: map at least one host to its limits" }
        hosts = options.hosts.entries.associate { (host, limits) ->
            require(limits.isNotEmpty()) { "limits: name at least one limit for host $host" }
            host.lowercase() to Host(limits.toList())
        }
        require(options.retriesMax in 0..DispatchOptions.RETRIES_MAX_LIMIT) {
            "retriesMax: must be a whole number from 0 to ${DispatchOptions.RETRIES_MAX_LIMIT}, got ${options.retriesMax}"
        }
        retriesMax = options.retriesMax
        require(backoffBase <= backoffMax) { "backoff: must be at most backoffMax" }
        require(retryAfterDefault <= retryAfterMax) { "retryAfterDefault: must be at most retryAfterMax" }
        require(retryAfterMax + resumeJitterMax <= DispatchOptions.PAUSE_MAX) {
            "retryAfterMax: with resumeJitterMax, must be at most a day (86400 s)"
        }
    }

    private fun seconds(name: String, value: Duration, allowZero: Boolean = true): Duration {
        require(!value.isNegative() && value.isFinite() && (allowZero || value.isPositive())) {
            "$name: must be ${if (allowZero) "at least 0" else "above 0"} and finite, got $value"
        }
        return value
    }

    /** The host entry for a request's host and port: `host:port` first, then `host`. */
    fun hostFor(host: String, port: Int): Host? {
        val name = host.lowercase()
        return (if (port >= 0) hosts["$name:$port"] else null) ?: hosts[name]
    }

    /**
     * The pause for a rate-limit answer: the vendor's wait (cut to retryAfterMax) or the
     * default, plus a random resumption jitter, never less than asked. Null when the vendor
     * asked for no wait: no pause is invented.
     */
    fun pauseFor(retryAfterSeconds: Long?): Duration? {
        val asked = if (retryAfterSeconds == null) {
            retryAfterDefault
        } else {
            minOf(if (retryAfterSeconds > retryAfterMax.inWholeSeconds + 1) retryAfterMax else retryAfterSeconds.seconds, retryAfterMax)
        }
        return if (asked <= Duration.ZERO) null else asked + jitter()
    }

    fun jitter(): Duration = (ThreadLocalRandom.current().nextDouble() * resumeJitterMax.inWholeNanoseconds).toLong().nanoseconds

    /** The wait before retry `attempt + 1`: `backoff * 2^attempt` capped at backoffMax, drawn between half and all of it. */
    fun backoff(attempt: Int): Duration {
        val full = minOf(backoffBase * Math.pow(2.0, minOf(attempt, 62).toDouble()), backoffMax)
        return full / 2 + full / 2 * ThreadLocalRandom.current().nextDouble()
    }

    /** How long the pause this process knows of on the host's limits has left (zero: none). */
    fun pausedFor(host: Host): Duration {
        val now = System.nanoTime()
        val until = host.names.maxOf { pausedUntil[it] ?: now }
        return if (until - now > 0) (until - now).nanoseconds else Duration.ZERO
    }

    /** Remember a pause of `limit` for `duration` from now; pauses only extend. */
    fun notePause(limit: String, duration: Duration) {
        val until = System.nanoTime() + duration.inWholeNanoseconds
        pausedUntil.merge(limit, until) { old, new -> if (new - old > 0) new else old }
    }

    companion object {
        private val IDEMPOTENT = setOf("GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE")

        @JvmStatic
        fun idempotent(method: String) = method.uppercase() in IDEMPOTENT
    }
}
