package tollgate.client

import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.delay
import java.io.IOException
import java.util.concurrent.ConcurrentHashMap
import java.util.logging.Level
import java.util.logging.Logger
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.nanoseconds
import kotlin.time.Duration.Companion.seconds

/** A vendor's answer as the dispatcher reads it: its status and every line of a header by name. */
interface VendorAnswer {
    val status: Int
    fun header(name: String): List<String>
}

/**
 * The vendor-call dispatcher, whatever sends the requests ([TollgateInterceptor] for OkHttp,
 * [TollgateHttpClient] for `java.net.http`). For a request to a mapped host it:
 *
 * 1. waits out any pause of the host's limits this process knows of, plus a random jitter so
 *    that a fleet does not resume in one burst;
 * 2. takes one unit of every limit mapped to the host (all or none) at the request's priority,
 *    waiting up to `waitMax` at the server;
 * 3. sends the request and classifies the answer ([Verdict]): on 429, or 503 with
 *    `Retry-After`, it pauses the host's first limit on the server for the vendor's wait (cut
 *    to `retryAfterMax`, plus jitter, never less than asked), so that every process of the
 *    fleet holds its requests until the vendor's cessation ends, and retries; on a transient
 *    failure it retries an idempotent request after a jittered, doubling backoff;
 * 4. unless `learn` is off, reads the vendor's rate-limit headers ([VendorAdvice]) and teaches
 *    the server what they say of the host's first limit when it is news;
 * 5. commits the unit (the call happened), with the grant-to-send delay when learning, and
 *    releases the lease of a concurrency limit **after** the pause is recorded, so that with a
 *    concurrency limit of 1 no other request leaves before the pause is in force.
 *
 * Retries stop after `retriesMax`; the last answer then goes back as the vendor gave it. When
 * no quota comes within `waitMax`, the request fails with [RateLimited] (nothing was sent).
 */
class Dispatcher @JvmOverloads constructor(
    val client: TollgateClient,
    options: DispatchOptions,
    /** A rule run before the defaults: a verdict, or null to let the defaults decide. */
    private val classify: ((VendorAnswer) -> Verdict?)? = null,
) {
    val policy = Policy(options)
    private val log = Logger.getLogger("tollgate.client.Dispatcher")

    /** Per limit taught: the quotas last taught, when (System.nanoTime), and whether the server has yet to take them. */
    private class Taught(val quotas: List<Quota>, val at: Long, @Volatile var pending: Boolean)

    private val taught = ConcurrentHashMap<String, Taught>()

    /** The host entry for a request's host and port (-1: none given), or null for a host not mapped. */
    fun hostFor(host: String, port: Int): Host? = policy.hostFor(host, port)

    private fun timedOut(host: Host, paused: Boolean, last: RateLimited?, retryAfter: Duration) = RateLimited(
        "no quota on ${host.names.joinToString(", ")} within ${policy.waitMax}${if (paused) " (paused)" else ""}",
        retryAfter,
        if (paused) "paused" else last?.reason,
        last?.limits.orEmpty(),
        status = last?.status,
    )

    private fun now() = System.nanoTime()

    /** Wait for leave to send one attempt: no pause known, one unit of the host's limits. */
    private suspend fun admit(host: Host, priority: Priority): Permit {
        val deadline = now() + policy.waitMax.inWholeNanoseconds
        var last: RateLimited? = null
        while (true) {
            val left = policy.pausedFor(host)
            if (left.isPositive()) {
                val resumeAt = now() + (left + policy.jitter()).inWholeNanoseconds
                if (resumeAt - deadline >= 0) throw timedOut(host, true, last, (resumeAt - now()).nanoseconds)
                delay((resumeAt - now()).nanoseconds)
            }
            val remaining = (deadline - now()).nanoseconds
            if (!remaining.isPositive()) throw timedOut(host, false, last, Duration.ZERO)
            val permit = try {
                client.acquire(host.names, 1, priority, remaining)
            } catch (error: RateLimited) {
                last = error
                if (error.reason == "paused") policy.notePause(host.pauseTarget, error.retryAfter)
                val after = (deadline - now()).nanoseconds
                if (after <= 1.milliseconds) throw timedOut(host, false, last, error.retryAfter)
                delay(minOf(maxOf(error.retryAfter, ASK_INTERVAL_MIN), after))
                continue
            }
            if (policy.pausedFor(host).isPositive()) {
                // Granted, but a pause began since: give the unit back, wait with the others.
                try {
                    permit.commit(0)
                } catch (_: TollgateException) {
                }
                continue
            }
            return permit
        }
    }

    /** Pause the host here at once, then fleet-wide through the server. */
    private suspend fun pauseHost(host: Host, retryAfterSeconds: Long?) {
        val pause = policy.pauseFor(retryAfterSeconds) ?: return
        policy.notePause(host.pauseTarget, pause)
        try {
            val left = client.pause(host.pauseTarget, pause)
            policy.notePause(host.pauseTarget, left)
        } catch (error: TollgateException) {
            log.log(Level.WARNING, "could not pause ${host.pauseTarget} on the Tollgate server; other processes will learn of the vendor's limit from the vendor", error)
        }
    }

    /** Teach the server what the vendor's answer says of the host's first limit, when that is news. Never throws. */
    private suspend fun teach(host: Host, source: String, status: Int, advice: VendorAdvice.Advice?, rateLimited: Boolean) {
        val quotas = advice?.quotas.orEmpty()
            .filter { it.quota <= QUOTA_MAX && (it.windowMs ?: 0) <= WINDOW_MS_MAX }
            .map { Quota(it.quota, it.windowMs?.milliseconds) }
        // A refusal says something of the limit only when the vendor did not say it itself.
        val refused = rateLimited && quotas.isEmpty()
        val last = taught[host.pauseTarget]
        val news = refused || advice?.remaining == 0L ||
            (quotas.isNotEmpty() && (last == null || last.quotas != quotas || last.pending || (now() - last.at).nanoseconds > LESSON_REFRESH))
        if (!news) return
        val entry = Taught(quotas, now(), quotas.isNotEmpty())
        taught[host.pauseTarget] = entry
        val from = if (advice == null) "HTTP $status" else "${advice.family} headers"
        val lesson = Lesson(
            "$from from $source".take(SOURCE_BYTES_MAX),
            quotas,
            advice?.remaining,
            advice?.resetMs?.milliseconds,
            refused,
        )
        try {
            val answer = client.learn(host.pauseTarget, lesson)
            entry.pending = false
            if (answer.paused.isPositive()) policy.notePause(host.pauseTarget, answer.paused)
        } catch (error: TollgateException) {
            log.log(Level.FINE, "lesson for ${host.pauseTarget} not taken: ${error.message}")
        }
    }

    /** The call happened (or may have): its unit stays used; a lease is released. */
    private suspend fun settle(permit: Permit, sentAfter: Duration?) {
        try {
            if (sentAfter == null) {
                permit.commit()
                return
            }
            try {
                permit.commit(null, minOf(sentAfter, SENT_AFTER_MAX))
            } catch (refused: BadRequest) {
                // A server that does not take the delay still takes the commit itself.
                permit.commit()
            }
        } catch (_: TollgateException) {
            // The lease runs to its TTL.
        }
    }

    /**
     * Send one request to a mapped `host` through the protocol above: `send` makes one attempt
     * (an [IOException] is a transient failure), `view` reads its answer, `discard` frees an
     * answer that is not handed back. `source` names the vendor in lessons (its host).
     */
    suspend fun <R> dispatch(
        host: Host,
        source: String,
        method: String,
        replayable: Boolean,
        priority: Priority?,
        send: suspend () -> R,
        view: (R) -> VendorAnswer,
        discard: (R) -> Unit,
    ): R {
        val retryTransient = replayable && Policy.idempotent(method)
        var attempt = 0
        while (true) {
            val permit = admit(host, priority ?: policy.priority)
            val sentAfter = if (policy.learn) (now() - permit.grantedAt).nanoseconds else null
            val response = try {
                send()
            } catch (error: IOException) {
                settle(permit, sentAfter)
                if (retryTransient && attempt < policy.retriesMax) {
                    delay(policy.backoff(attempt))
                    attempt++
                    continue
                }
                throw error
            } catch (error: CancellationException) {
                withNonCancellable { settle(permit, sentAfter) }
                throw error
            }
            val answer = view(response)
            var verdict = classify?.invoke(answer) ?: Verdict.of(answer.status, answer.header("retry-after").firstOrNull())
            if (verdict == Verdict.Retry && !retryTransient) verdict = Verdict.Done
            withNonCancellable {
                if (verdict is Verdict.RateLimited) pauseHost(host, verdict.retryAfterSeconds)
                if (policy.learn) {
                    teach(host, source, answer.status, VendorAdvice.read(answer::header, System.currentTimeMillis()), verdict is Verdict.RateLimited)
                }
                // Only now: with a concurrency limit of 1, nothing leaves before the pause is in force.
                settle(permit, sentAfter)
            }
            if (verdict == Verdict.Done || attempt >= policy.retriesMax || !replayable) return response
            discard(response)
            if (verdict == Verdict.Retry) delay(policy.backoff(attempt))
            attempt++
        }
    }

    private suspend fun withNonCancellable(block: suspend () -> Unit) =
        kotlinx.coroutines.withContext(kotlinx.coroutines.NonCancellable) { block() }

    companion object {
        /** The shortest sleep between two asks when the server answers before the deadline. */
        private val ASK_INTERVAL_MIN = 10.milliseconds

        /** Quotas already taught are taught again after this long: the server forgets. */
        private val LESSON_REFRESH = 60.seconds

        /** The longest grant-to-send delay the server takes. */
        private val SENT_AFTER_MAX = 3600.seconds
        private const val SOURCE_BYTES_MAX = 128
        private const val QUOTA_MAX = 1L shl 53
        private const val WINDOW_MS_MAX = 366L * 86_400_000
    }
}
