package tollgate.client

import java.math.BigInteger
import java.time.LocalDate
import java.time.ZoneOffset

/**
 * Reading a vendor's rate-limit headers ("advice"), free of I/O: the quotas a vendor
 * advertises, the calls it has left and when its window resets, from whichever of the five
 * common header families its answer carries, the first with any of its fields present winning:
 * `ietf` (`RateLimit-Policy`, `RateLimit`), `openai` (`x-ratelimit-*-requests`, the reset a Go
 * duration), `anthropic` (`anthropic-ratelimit-requests-*`, the reset an RFC 3339 date-time),
 * `github` (`x-ratelimit-*`, the reset in epoch seconds), `ietf-draft` (`RateLimit-Limit`,
 * `-Remaining`, `-Reset`, the reset in seconds).
 *
 * A value that cannot be read, or longer than [VALUE_BYTES_MAX], makes its field null: never
 * an error, never a guess. The same rules as tollgate-dispatch's and the Python and
 * TypeScript clients', held to the same vectors (`crates/dispatch/tests/vectors/vendor_headers.json`).
 */
object VendorAdvice {
    /** Longest header value read, in bytes. */
    const val VALUE_BYTES_MAX = 256

    /** Most quotas kept from one answer (the first ones). */
    const val QUOTAS_MAX = 8

    /** Milliseconds above this are unreadable: no integer type of any implementation loses them. */
    private const val MS_MAX = 1L shl 53

    /** One quota a vendor advertises: `quota` calls per `windowMs` (null: not said). */
    data class AdvisedQuota(val quota: Long, val windowMs: Long?)

    /** What a vendor's answer says of its limits; times in milliseconds. */
    data class Advice(val family: String, val quotas: List<AdvisedQuota>, val remaining: Long?, val resetMs: Long?)

    private val INT = Regex("[0-9]{1,16}")
    private val TOKEN = Regex("[A-Za-z*][A-Za-z0-9!#$%&'*+\\-.^_`|~:/]*")

    /**
     * The advice of the first family with any field present, or null. `headers` gives every
     * line of a field by its name, in any case (empty when absent).
     */
    @JvmStatic
    fun read(headers: (String) -> List<String>, nowMs: Long): Advice? {
        val present = { name: String -> headers(name).isNotEmpty() }
        val value = { name: String ->
            val lines = headers(name)
            if (lines.isEmpty()) {
                null
            } else {
                val joined = lines.joinToString(", ")
                if (wireBytes(joined) > VALUE_BYTES_MAX) null else joined.trim(' ', '\t')
            }
        }
        if (present("ratelimit-policy") || present("ratelimit")) return ietf(value("ratelimit-policy"), value("ratelimit"))
        fun simple(family: String, limit: String, remaining: String, reset: String, resetMs: (String) -> Long?): Advice? {
            if (!present(limit) && !present(remaining) && !present(reset)) return null
            val quota = int(value(limit))
            return Advice(
                family,
                kept(if (quota == null) emptyList() else listOf(AdvisedQuota(quota, null))),
                int(value(remaining)),
                value(reset)?.let(resetMs),
            )
        }
        return simple("openai", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests", ::goDurationMs)
            ?: simple("anthropic", "anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset") { text ->
                rfc3339Ms(text)?.let { maxOf(0, it - nowMs) }
            }
            ?: simple("github", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset") { text ->
                secondsMs(int(text))?.let { maxOf(0, it - nowMs) }
            }
            ?: simple("ietf-draft", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset") { text -> secondsMs(int(text)) }
    }

    /** An int: 1-16 ASCII digits, nothing else. */
    private fun int(text: String?): Long? = if (text != null && INT.matches(text)) text.toLong() else null

    private fun secondsMs(seconds: Long?): Long? = if (seconds != null && seconds <= MS_MAX / 1000) seconds * 1000 else null

    private fun kept(quotas: List<AdvisedQuota>) = quotas.filter { it.quota > 0 }.take(QUOTAS_MAX)

    // ---- structured fields (the part of RFC 8941 the ratelimit headers use) -----------------

    private class Member(val name: String, val parameters: Map<String, String>)

    /** `text` split at `separator` outside quoted strings; null if a quoted string is unterminated. */
    private fun splitOutsideQuotes(text: String, separator: Char): List<String>? {
        val parts = ArrayList<String>()
        val current = StringBuilder()
        var quoted = false
        var index = 0
        while (index < text.length) {
            val char = text[index]
            if (quoted) {
                current.append(char)
                if (char == '\\' && index + 1 < text.length) {
                    index++
                    current.append(text[index])
                } else if (char == '"') {
                    quoted = false
                }
            } else if (char == '"') {
                quoted = true
                current.append(char)
            } else if (char == separator) {
                parts.add(current.toString())
                current.setLength(0)
            } else {
                current.append(char)
            }
            index++
        }
        if (quoted) return null
        parts.add(current.toString())
        return parts
    }

    private fun trim(text: String) = text.trim(' ', '\t')

    /** The content of a quoted string (printable ASCII, `\\` and `\"` escapes only), or null. */
    private fun quotedString(text: String): String? {
        if (text.length < 2 || !text.startsWith('"') || !text.endsWith('"')) return null
        val out = StringBuilder()
        var index = 1
        while (index < text.length - 1) {
            val char = text[index]
            if (char == '\\') {
                val next = text.getOrNull(index + 1)
                if ((next != '"' && next != '\\') || index + 1 >= text.length - 1) return null
                out.append(next)
                index += 2
                continue
            }
            if (char == '"' || char < ' ' || char > '~') return null
            out.append(char)
            index++
        }
        return out.toString()
    }

    private fun stringOrToken(text: String): String? = if (TOKEN.matches(text)) text else quotedString(text)

    private fun members(text: String?): List<Member>? {
        if (text == null) return null
        val raw = splitOutsideQuotes(text, ',') ?: return null
        val out = ArrayList<Member>()
        for (member in raw) {
            if (trim(member).isEmpty()) continue
            val pieces = splitOutsideQuotes(member, ';') ?: emptyList()
            val name = stringOrToken(trim(pieces.firstOrNull() ?: "")) ?: continue
            val parameters = LinkedHashMap<String, String>()
            for (parameter in pieces.drop(1)) {
                val equals = parameter.indexOf('=')
                if (equals >= 0) parameters[trim(parameter.substring(0, equals))] = trim(parameter.substring(equals + 1))
            }
            out.add(Member(name, parameters))
        }
        return out
    }

    /** An int parameter: absent is `absent`, present but not an int is null. */
    private object Absent

    private fun intParameter(member: Member, key: String): Any? {
        val raw = member.parameters[key] ?: return Absent
        return int(raw)
    }

    private fun ietf(policy: String?, state: String?): Advice {
        val quotas = ArrayList<AdvisedQuota>()
        for (member in members(policy).orEmpty()) {
            val unit = member.parameters["qu"]
            if (unit != null && stringOrToken(unit) != "requests") continue
            val quota = intParameter(member, "q") as? Long ?: continue
            val window = intParameter(member, "w")
            val windowMs = if (window === Absent) null else secondsMs(window as Long?)
            if (window !== Absent && (windowMs == null || windowMs < 1)) continue
            quotas.add(AdvisedQuota(quota, windowMs))
        }
        var remaining: Long? = null
        var leastReset: Long? = null
        var exhausted = false
        var exhaustedReset: Long? = null
        for (member in members(state).orEmpty()) {
            val left = intParameter(member, "r") as? Long
            val reset = (intParameter(member, "t") as? Long)?.let { secondsMs(it) }
            if (left != null) remaining = if (remaining == null) left else minOf(remaining, left)
            if (reset != null) leastReset = if (leastReset == null) reset else minOf(leastReset, reset)
            if (left == 0L) {
                exhausted = true
                if (reset != null) exhaustedReset = if (exhaustedReset == null) reset else maxOf(exhaustedReset, reset)
            }
        }
        // Nothing left: the wait is until the last exhausted window resets, never a guess.
        return Advice("ietf", kept(quotas), remaining, if (exhausted) exhaustedReset else leastReset)
    }

    // ---- durations and dates ----------------------------------------------------------------

    private val DURATION_PART = Regex("([0-9]{1,16}(?:\\.[0-9]{1,9})?)(ms|h|m|s)")
    private val UNIT_MS = mapOf("h" to 3_600_000L, "m" to 60_000L, "s" to 1000L, "ms" to 1L)

    /** Milliseconds of a Go duration (`1h2m3.5s`, `20ms`, `0s`), exactly, rounded up; null if unreadable. */
    @JvmStatic
    fun goDurationMs(text: String): Long? {
        if (text.isEmpty()) return null
        var numerator = BigInteger.ZERO
        var denominator = BigInteger.ONE
        var rest = text
        while (rest.isNotEmpty()) {
            val part = DURATION_PART.matchAt(rest, 0) ?: return null
            rest = rest.substring(part.value.length)
            val number = part.groupValues[1]
            val whole = number.substringBefore('.')
            val fraction = if (number.contains('.')) number.substringAfter('.') else ""
            val scale = BigInteger.TEN.pow(fraction.length)
            val amount = BigInteger(whole) * scale + (if (fraction.isEmpty()) BigInteger.ZERO else BigInteger(fraction))
            val ms = amount * BigInteger.valueOf(UNIT_MS.getValue(part.groupValues[2]))
            numerator = numerator * scale + ms * denominator
            denominator *= scale
        }
        val rounded = (numerator + denominator - BigInteger.ONE) / denominator
        return if (rounded <= BigInteger.valueOf(MS_MAX)) rounded.toLong() else null
    }

    private val RFC3339 = Regex(
        "([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\\.([0-9]{1,9}))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))",
    )

    /** Epoch milliseconds of an RFC 3339 date-time, a fraction of a millisecond counted whole; null if unreadable. */
    @JvmStatic
    fun rfc3339Ms(text: String): Long? {
        val match = RFC3339.matchEntire(text) ?: return null
        val group = match.groupValues
        val hour = group[4].toInt()
        val minute = group[5].toInt()
        val second = group[6].toInt()
        if (hour > 23 || minute > 59 || second > 59) return null
        val date = try {
            LocalDate.of(group[1].toInt(), group[2].toInt(), group[3].toInt())
        } catch (_: java.time.DateTimeException) {
            return null
        }
        val at = date.atTime(hour, minute, second).toEpochSecond(ZoneOffset.UTC) * 1000
        var offsetMs = 0L
        if (group[9].isNotEmpty()) {
            val offsetHours = group[10].toInt()
            val offsetMinutes = group[11].toInt()
            if (offsetHours > 23 || offsetMinutes > 59) return null
            offsetMs = (if (group[9] == "+") 1 else -1) * (offsetHours * 60L + offsetMinutes) * 60_000L
        }
        // A fraction of a millisecond counts as a whole one: a reset is never brought forward.
        val fraction = group[7]
        val fractionMs = fraction.padEnd(3, '0').take(3).toLong() + (if (fraction.drop(3).any { it in '1'..'9' }) 1 else 0)
        return at - offsetMs + fractionMs
    }
}
