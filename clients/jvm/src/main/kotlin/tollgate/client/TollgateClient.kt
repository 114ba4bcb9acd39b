package tollgate.client

import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.GlobalScope
import kotlinx.coroutines.NonCancellable
import kotlinx.coroutines.SupervisorJob
import kotlinx.coroutines.future.await
import kotlinx.coroutines.future.future
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout
import kotlinx.coroutines.suspendCancellableCoroutine
import kotlin.coroutines.resume
import kotlin.coroutines.resumeWithException
import kotlinx.coroutines.TimeoutCancellationException
import java.net.URI
import java.net.URLEncoder
import java.net.http.HttpClient
import java.net.http.HttpRequest
import java.net.http.HttpResponse
import java.net.http.HttpTimeoutException
import java.util.concurrent.CompletableFuture
import java.util.concurrent.TimeoutException
import java.util.function.Function
import java.util.logging.Logger
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds
import kotlin.time.toJavaDuration
import kotlin.time.toKotlinDuration

/** Where `tollgate serve` listens by default. */
const val DEFAULT_URL = "http://127.0.0.1:7070"

/** An answer read whole, and when it was asked and came (System.nanoTime). */
internal class Answer(val status: Int, val headers: java.net.http.HttpHeaders, val text: String, val asked: Long, val at: Long)

/**
 * How an acquire asks, for Java: units of every limit named ([cost], default 1), [priority],
 * how long the server may hold it for room ([wait], default none), and the counter of limits
 * counted per [key]. Immutable; each setter returns a changed copy.
 */
data class AcquireOptions @JvmOverloads constructor(
    val cost: Long = 1,
    val priority: Priority = Priority.NORMAL,
    val wait: java.time.Duration = java.time.Duration.ZERO,
    val key: String? = null,
) {
    fun cost(cost: Long) = copy(cost = cost)
    fun priority(priority: Priority) = copy(priority = priority)
    fun waitFor(wait: java.time.Duration) = copy(wait = wait)
    fun key(key: String?) = copy(key = key)

    companion object {
        @JvmStatic
        fun defaults() = AcquireOptions()
    }
}

/**
 * A client of a Tollgate server, for Kotlin (suspending functions) and Java (`...Async`
 * returning [CompletableFuture], `...Blocking` with a timeout). One per process is enough:
 * calls share one [HttpClient]'s connections and may run concurrently.
 *
 * What is not given is read as the `tollgate` commands read it: the URL is `url`, else
 * `TOLLGATE_SERVER`, else `http://127.0.0.1:7070`; the data plane's token is `token`, else
 * `TOLLGATE_DATA_TOKEN`; the admin API's is `adminToken`, else `token`, else
 * `TOLLGATE_ADMIN_TOKEN`, else the token a local server keeps for this user ([Kept]), sent to
 * that server alone once it has proved it holds it. `TOLLGATE_DATA_TOKEN` is never sent to the
 * admin API.
 */
class TollgateClient(
    url: String? = null,
    private val token: String? = null,
    private val adminToken: String? = null,
    /** How long one call may take; a waiting acquire gets its wait on top. */
    val timeout: Duration = 10.seconds,
    httpClient: HttpClient? = null,
) {
    /** The server's URL, without a trailing slash. */
    val url: String = (url?.ifEmpty { null } ?: System.getenv("TOLLGATE_SERVER")?.ifEmpty { null } ?: DEFAULT_URL).trimEnd('/')
    private val dataTokenFromEnvironment: String? = if (token.isNullOrEmpty()) System.getenv("TOLLGATE_DATA_TOKEN")?.ifEmpty { null } else null
    private val http: HttpClient = httpClient
        ?: HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(timeout.toJavaDuration()).build()

    /** Where the kept admin token is looked for: the environment (tests give their own). */
    internal var environment: (String) -> String? = System::getenv

    /** The scope of the Java faces' futures and of settling grants given up by their caller. */
    internal val scope = CoroutineScope(SupervisorJob() + Dispatchers.Default)

    /** The admin API. */
    @get:JvmName("limits")
    val limits = LimitsAdmin(this)

    init {
        require(timeout.isPositive() && timeout.isFinite()) { "timeout: above 0 and finite, got $timeout" }
    }

    // ---- requests -----------------------------------------------------------------------

    private fun build(target: String, method: String, body: Any?, token: String?, wait: Duration): HttpRequest {
        val builder = HttpRequest.newBuilder(URI(target)).timeout((timeout + wait).toJavaDuration())
        if (token != null) builder.header("authorization", "Bearer $token")
        if (body != null) {
            builder.header("content-type", "application/json")
            builder.method(method, HttpRequest.BodyPublishers.ofString(Json.write(body)))
        } else {
            builder.method(method, HttpRequest.BodyPublishers.noBody())
        }
        return builder.build()
    }

    /**
     * Send one request and read its answer whole; no answer at all is [ServerUnreachable].
     * `onLate` gets an answer that came although the caller gave up (cancelled) meanwhile.
     */
    internal suspend fun send(
        method: String,
        path: String,
        body: Any?,
        admin: Boolean,
        wait: Duration = Duration.ZERO,
        onLate: ((Answer) -> Unit)? = null,
    ): Answer {
        var target = url + path
        var bearer = if (admin) adminToken ?: token ?: Kept.givenAdminToken() else token?.ifEmpty { null } ?: dataTokenFromEnvironment
        if (admin && bearer == null) {
            val kept = Kept.keptAdminToken(url, environment)
            if (kept != null && proved(kept)) {
                target = kept.base + path
                bearer = kept.token
            }
        }
        val request = build(target, method, body, bearer, wait)
        val asked = System.nanoTime()
        val exchange = http.sendAsync(request, HttpResponse.BodyHandlers.ofString())
        try {
            val response = suspendCancellableCoroutine { continuation ->
                exchange.whenComplete { value, error ->
                    if (error == null) continuation.resume(value) else continuation.resumeWithException(error)
                }
                continuation.invokeOnCancellation { exchange.cancel(true) }
            }
            return Answer(response.statusCode(), response.headers(), response.body(), asked, System.nanoTime())
        } catch (cancelled: CancellationException) {
            // Gives the exchange itself up (not a stage after it): its connection closes, and
            // the server forgets a request still waiting there. One answered meanwhile is late.
            exchange.cancel(true)
            if (onLate != null) {
                exchange.thenAccept { onLate(Answer(it.statusCode(), it.headers(), it.body(), asked, System.nanoTime())) }
            }
            throw cancelled
        } catch (error: Exception) {
            val cause = if (error is java.util.concurrent.CompletionException) error.cause ?: error else error
            val detail = if (cause is HttpTimeoutException) "no answer within ${timeout + wait}" else cause.toString()
            throw ServerUnreachable("no answer from the Tollgate server at $url: $detail", cause)
        }
    }

    /** Whether the server at the address `kept` records proves it holds that token, asked with a fresh nonce. */
    private suspend fun proved(kept: Kept.KeptToken): Boolean {
        val nonce = Kept.proofNonce()
        val why = try {
            val request = build("${kept.base}${Kept.PROOF_PATH}?${Kept.PROOF_NONCE_PARAMETER}=$nonce", "GET", null, null, Duration.ZERO)
            val response = http.sendAsync(request, HttpResponse.BodyHandlers.ofString()).await()
            if (response.statusCode() != 200) {
                "it answered ${response.statusCode()}"
            } else {
                val answer = try { Json.read(response.body()) } catch (_: IllegalArgumentException) { null }
                if (Kept.proved(kept.token, kept.listen, nonce, answer)) return true
                "its proof does not match"
            }
        } catch (cancelled: CancellationException) {
            throw cancelled
        } catch (error: Exception) {
            "no answer: $error"
        }
        Logger.getLogger("tollgate.client").warning(kept.refusal(why))
        return false
    }

    /** The JSON object of a success, or the error an error answer stands for. */
    internal fun decode(answer: Answer): Map<String, Any?> {
        if (answer.status >= 400) throw errorFromAnswer(answer.status, answer.headers.firstValue("retry-after").orElse(null), answer.text)
        val body = try {
            Json.read(answer.text)
        } catch (_: IllegalArgumentException) {
            throw ServerError("HTTP ${answer.status} with a body that is not JSON", status = answer.status)
        }
        @Suppress("UNCHECKED_CAST")
        return body as? Map<String, Any?> ?: throw ServerError("HTTP ${answer.status} with a body that is not a JSON object", status = answer.status)
    }

    internal suspend fun request(method: String, path: String, body: Any?, admin: Boolean = false): Map<String, Any?> =
        decode(send(method, path, body, admin))

    // ---- data plane ---------------------------------------------------------------------

    /**
     * Take `cost` units of every limit named (all or none), waiting up to `wait` at the
     * server for room. `key` picks the counter of limits counted per key. Throws
     * [RateLimited] when nothing was granted in time. Cancelling the calling coroutine gives
     * the wait up, and a grant that comes anyway is given back: it counts nothing.
     */
    suspend fun acquire(
        limits: Collection<String>,
        cost: Long = 1,
        priority: Priority = Priority.NORMAL,
        wait: Duration = Duration.ZERO,
        key: String? = null,
    ): Permit {
        val waitMs = wholeMillis(wait, "wait")
        val body = linkedMapOf<String, Any?>(
            "limits" to limitNames(limits), "cost" to cost, "priority" to priority.wire, "wait_ms" to waitMs,
        )
        if (key != null) body["key"] = key
        val raw = send("POST", "/v1/acquire", body, false, waitMs.milliseconds, onLate = { late -> giveBack(late, cost) })
        return permitOf(raw, cost)
    }

    /** One unit (or `cost`) of one limit; see the other [acquire]. */
    suspend fun acquire(
        limit: String,
        cost: Long = 1,
        priority: Priority = Priority.NORMAL,
        wait: Duration = Duration.ZERO,
        key: String? = null,
    ): Permit = acquire(listOf(limit), cost, priority, wait, key)

    private fun permitOf(raw: Answer, cost: Long): Permit {
        val answer = decode(raw)
        val id = answer["permit"] as? String ?: throw ServerError("the grant carries no permit id")
        // The grant was made when the server let the request go (its Server-Timing says how
        // long it held it): the time since is the answer's way back, which a margin must cover.
        val held = serverHeldNanos(raw.headers.firstValue("server-timing").orElse(null))
        val grantedAt = if (held == null) raw.at else minOf(raw.asked + held, raw.at)
        return Permit(this, id, limitStatuses(answer["limits"]), cost, grantedAt)
    }

    /** A grant whose caller gave up: committed with nothing used, so it counts nothing. */
    private fun giveBack(late: Answer, cost: Long) {
        if (late.status != 200) return
        scope.launch {
            try {
                permitOf(late, cost).commit(0)
            } catch (_: TollgateException) {
                // A lease then runs to its TTL.
            }
        }
    }

    /** Like [acquire], but null instead of throwing [RateLimited]. */
    suspend fun tryAcquire(
        limits: Collection<String>,
        cost: Long = 1,
        priority: Priority = Priority.NORMAL,
        wait: Duration = Duration.ZERO,
        key: String? = null,
    ): Permit? = try {
        acquire(limits, cost, priority, wait, key)
    } catch (_: RateLimited) {
        null
    }

    suspend fun tryAcquire(limit: String, cost: Long = 1, priority: Priority = Priority.NORMAL, wait: Duration = Duration.ZERO, key: String? = null): Permit? =
        tryAcquire(listOf(limit), cost, priority, wait, key)

    /**
     * Run `block` under a permit: acquire first (throwing [RateLimited] before `block` runs
     * when nothing comes in time), then settle when `block` ends: a normal exit commits
     * `permit.used` (all of `cost` unless set); an exception (cancellation included) commits
     * nothing, the rate units staying spent (the call may have happened), and releases any lease.
     */
    suspend fun <T> withPermit(
        limits: Collection<String>,
        cost: Long = 1,
        priority: Priority = Priority.NORMAL,
        wait: Duration = Duration.ZERO,
        key: String? = null,
        block: suspend (Permit) -> T,
    ): T {
        val permit = acquire(limits, cost, priority, wait, key)
        val result = try {
            block(permit)
        } catch (error: Throwable) {
            withContext(NonCancellable) { permit.abandon() }
            throw error
        }
        if (!permit.settled) withContext(NonCancellable) { permit.commit() }
        return result
    }

    suspend fun <T> withPermit(
        limit: String,
        cost: Long = 1,
        priority: Priority = Priority.NORMAL,
        wait: Duration = Duration.ZERO,
        key: String? = null,
        block: suspend (Permit) -> T,
    ): T = withPermit(listOf(limit), cost, priority, wait, key, block)

    /**
     * Grant nothing on `limit` (or only its counter for `key`) for `duration`, fleet-wide.
     * Pauses only extend: returns how long the pause in force has left.
     */
    suspend fun pause(limit: String, duration: Duration, key: String? = null): Duration {
        val body = linkedMapOf<String, Any?>("limit" to limit, "retry_after_ms" to wholeMillis(duration, "duration"))
        if (key != null) body["key"] = key
        return ((request("POST", "/v1/pause", body).number("paused_ms")) ?: 0.0).milliseconds
    }

    /**
     * Teach the server what a vendor's answer said of its limits (`POST /v1/learn`): it lowers
     * the rate limit `limit` to the least quota advertised for a while, pauses it when the
     * vendor has nothing left, and lowers it step by step on `rateLimited` refusals.
     */
    suspend fun learn(limit: String, lesson: Lesson): Learnt {
        val body = linkedMapOf<String, Any?>(
            "limit" to limit,
            "source" to lesson.source,
            "quotas" to lesson.quotas.mapIndexed { index, quota ->
                linkedMapOf<String, Any?>("quota" to quota.quota).also { item ->
                    quota.window?.let { item["window_ms"] = wholeMillis(it, "quotas[$index].window") }
                }
            },
        )
        lesson.remaining?.let { body["remaining"] = it }
        lesson.reset?.let { body["reset_ms"] = wholeMillis(it, "reset") }
        if (lesson.rateLimited) body["rate_limited"] = true
        val answer = request("POST", "/v1/learn", body)
        return Learnt(
            (answer["limit"] ?: limit).toString(),
            answer.long("configured") ?: 0,
            answer.long("effective") ?: 0,
            (answer.number("paused_ms") ?: 0.0).milliseconds,
        )
    }

    /**
     * May `user` make the inbound request `method path` now? Applies every limit whose
     * `match` fits, all or none. A denial is `allowed = false` (with `retryAfter`), not an
     * exception. When a concurrency limit applied, the result's `permit` holds the lease.
     */
    suspend fun check(method: String, path: String, user: String? = null): CheckResult {
        val body = linkedMapOf<String, Any?>("method" to method, "path" to path)
        if (user != null) body["user"] = user
        val answer = send("POST", "/v1/check", body, false)
        if (answer.status == 429) {
            val error = errorFromAnswer(429, answer.headers.firstValue("retry-after").orElse(null), answer.text)
            val denied = try { Json.read(answer.text) as? Map<*, *> } catch (_: IllegalArgumentException) { null }
            if (error !is RateLimited || denied == null) throw error
            return CheckResult(false, (denied["path"] ?: "").toString(), names(denied["matched"]), error.limits, error.retryAfter, error.reason)
        }
        val allowed = decode(answer)
        val limits = limitStatuses(allowed["limits"])
        val permit = (allowed["permit"] as? String)?.let { Permit(this, it, limits, 1, System.nanoTime()) }
        return CheckResult(allowed["allowed"] == true, (allowed["path"] ?: "").toString(), names(allowed["matched"]), limits, permit = permit)
    }

    private fun names(raw: Any?): List<String> = (raw as? List<*>).orEmpty().map { it.toString() }

    // ---- Java faces -----------------------------------------------------------------------

    internal fun <T> async(block: suspend CoroutineScope.() -> T): CompletableFuture<T> = scope.future(block = block)

    @Throws(TimeoutException::class)
    internal fun <T> blocking(timeout: java.time.Duration, block: suspend CoroutineScope.() -> T): T = runBlocking {
        try {
            withTimeout(timeout.toKotlinDuration(), block)
        } catch (expired: TimeoutCancellationException) {
            throw TimeoutException("no answer within $timeout").also { it.initCause(expired) }
        }
    }

    /** [acquire] for Java; cancelling the future gives the wait up, as cancelling a coroutine does. */
    fun acquireAsync(limits: List<String>, options: AcquireOptions): CompletableFuture<Permit> =
        async { acquire(limits, options.cost, options.priority, options.wait.toKotlinDuration(), options.key) }

    fun acquireAsync(limit: String): CompletableFuture<Permit> = acquireAsync(listOf(limit), AcquireOptions())

    /** [acquire] for Java, giving up after `timeout` with [TimeoutException] (nothing counted). */
    @Throws(TimeoutException::class)
    fun acquireBlocking(limits: List<String>, options: AcquireOptions, timeout: java.time.Duration): Permit =
        blocking(timeout) { acquire(limits, options.cost, options.priority, options.wait.toKotlinDuration(), options.key) }

    /** [tryAcquire] for Java: completes with null when nothing was granted. */
    fun tryAcquireAsync(limits: List<String>, options: AcquireOptions): CompletableFuture<Permit?> =
        async { tryAcquire(limits, options.cost, options.priority, options.wait.toKotlinDuration(), options.key) }

    @Throws(TimeoutException::class)
    fun tryAcquireBlocking(limits: List<String>, options: AcquireOptions, timeout: java.time.Duration): Permit? =
        blocking(timeout) { tryAcquire(limits, options.cost, options.priority, options.wait.toKotlinDuration(), options.key) }

    /**
     * [withPermit] for Java: `work` returns a future; its result commits `permit.used`, its
     * failure commits nothing and releases any lease.
     */
    fun <T> withPermitAsync(limits: List<String>, options: AcquireOptions, work: Function<Permit, CompletableFuture<T>>): CompletableFuture<T> =
        async { withPermit(limits, options.cost, options.priority, options.wait.toKotlinDuration(), options.key) { work.apply(it).await() } }

    /** [withPermit] for Java, on the calling thread; `timeout` bounds the whole (acquire, work, commit). */
    @Throws(TimeoutException::class)
    fun <T> withPermitBlocking(limits: List<String>, options: AcquireOptions, timeout: java.time.Duration, work: Function<Permit, T>): T =
        blocking(timeout) {
            withPermit(limits, options.cost, options.priority, options.wait.toKotlinDuration(), options.key) {
                withContext(Dispatchers.IO) { work.apply(it) }
            }
        }

    fun pauseAsync(limit: String, duration: java.time.Duration, key: String?): CompletableFuture<java.time.Duration> =
        async { pause(limit, duration.toKotlinDuration(), key).toJavaDuration() }

    @Throws(TimeoutException::class)
    fun pauseBlocking(limit: String, duration: java.time.Duration, key: String?, timeout: java.time.Duration): java.time.Duration =
        blocking(timeout) { pause(limit, duration.toKotlinDuration(), key).toJavaDuration() }

    fun checkAsync(method: String, path: String, user: String?): CompletableFuture<CheckResult> = async { check(method, path, user) }

    @Throws(TimeoutException::class)
    fun checkBlocking(method: String, path: String, user: String?, timeout: java.time.Duration): CheckResult =
        blocking(timeout) { check(method, path, user) }

    override fun toString() = "TollgateClient($url)"

    /** How a [TollgateClient] is made from Java. */
    class Builder internal constructor() {
        private var url: String? = null
        private var token: String? = null
        private var adminToken: String? = null
        private var timeout: java.time.Duration = java.time.Duration.ofSeconds(10)
        private var httpClient: HttpClient? = null
        fun url(url: String?) = apply { this.url = url }
        fun token(token: String?) = apply { this.token = token }
        fun adminToken(adminToken: String?) = apply { this.adminToken = adminToken }
        fun timeout(timeout: java.time.Duration) = apply { this.timeout = timeout }
        fun httpClient(httpClient: HttpClient?) = apply { this.httpClient = httpClient }
        fun build() = TollgateClient(url, token, adminToken, timeout.toKotlinDuration(), httpClient)
    }

    companion object {
        @JvmStatic
        fun builder() = Builder()
    }
}

internal fun permitPath(id: String, action: String) = "/v1/permits/${URLEncoder.encode(id, Charsets.UTF_8).replace("+", "%20")}/$action"

internal fun limitPath(name: String) = "/v1/limits/${URLEncoder.encode(name, Charsets.UTF_8).replace("+", "%20")}"

/** How long a Tollgate server held an acquire, from `Server-Timing: acquire;dur=MS`, in nanoseconds; null when unreadable. */
internal fun serverHeldNanos(value: String?): Long? {
    if (value == null) return null
    for (metric in value.split(',')) {
        val parts = metric.split(';').map { it.trim() }
        if (parts.first() != "acquire") continue
        val duration = parts.drop(1).firstOrNull { it.startsWith("dur=") }?.removePrefix("dur=")?.trim() ?: continue
        val ms = duration.toDoubleOrNull() ?: continue
        if (ms.isFinite() && ms >= 0 && ms <= 86_400_000) return (ms * 1_000_000).toLong()
    }
    return null
}

/**
 * What an acquire granted: rate units, and a lease for each concurrency limit. Settle it once:
 * [commit] says how many units were used (the rest are refunded) and ends its leases.
 */
class Permit internal constructor(
    private val client: TollgateClient,
    /** The opaque permit id. */
    val id: String,
    /** Each limit's state at the grant. */
    val limits: List<LimitStatus>,
    /** Units granted. */
    val cost: Long,
    /** When the grant's answer reached this process (System.nanoTime). */
    internal val grantedAt: Long,
) {
    /** Units to commit when settled by [TollgateClient.withPermit]; null means all of [cost]. */
    @Volatile
    var used: Long? = null

    private val settledFlag = java.util.concurrent.atomic.AtomicBoolean(false)

    /** Whether the permit was committed or released (or that was attempted). */
    val settled: Boolean get() = settledFlag.get()

    /** The fencing number of the permit's lease, or null if it holds no lease. */
    val fence: Long? get() = limits.firstNotNullOfOrNull { it.fence }

    /**
     * Say `used` units were used (default: [used], else all of [cost]); the rest of the rate
     * units are refunded and leases released. Once per permit: a second commit is [Conflict].
     * `sentAfter` reports how long after the grant the call it stands for left.
     */
    suspend fun commit(used: Long? = null, sentAfter: Duration? = null): Committed {
        val units = used ?: this.used ?: cost
        settledFlag.set(true)
        val body = linkedMapOf<String, Any?>("used" to units)
        if (sentAfter != null) body["sent_after_ms"] = wholeMillis(sentAfter, "sentAfter")
        val answer = client.request("POST", permitPath(id, "commit"), body)
        return Committed(answer.long("refunded") ?: 0, answer.long("released") ?: 0)
    }

    /** End the permit's leases; its rate units stay used. */
    suspend fun release(): Committed = commit(cost)

    /** Extend every lease of the permit by its TTL; returns the time until the earliest expires. */
    suspend fun renew(): Duration = (client.request("POST", permitPath(id, "renew"), emptyMap<String, Any?>()).number("expires_ms") ?: 0.0).milliseconds

    /** Settle after work that threw: nothing committed, any lease released. */
    internal suspend fun abandon() {
        if (!settledFlag.compareAndSet(false, true)) return
        if (fence == null) return
        try {
            commit(cost)
        } catch (_: TollgateException) {
            // The work's own error matters more; the lease runs to its TTL.
        }
    }

    /** [commit] for Java (`used` null: all of [cost] unless [used] was set). */
    fun commitAsync(used: Long?): CompletableFuture<Committed> = client.async { commit(used) }

    @Throws(TimeoutException::class)
    fun commitBlocking(used: Long?, timeout: java.time.Duration): Committed = client.blocking(timeout) { commit(used) }

    fun releaseAsync(): CompletableFuture<Committed> = client.async { release() }

    fun renewAsync(): CompletableFuture<java.time.Duration> = client.async { renew().toJavaDuration() }

    override fun toString() = "Permit($id, cost $cost)"
}

/**
 * The admin API (`client.limits`): put, get, list and delete limits, with the admin token (or
 * else the data token, `TOLLGATE_ADMIN_TOKEN`, or a kept one).
 */
class LimitsAdmin internal constructor(private val client: TollgateClient) {
    /** Create or replace limit `name`; returns it as stored, defaults filled in. */
    suspend fun put(name: String, rule: LimitRule): Map<String, Any?> = client.request("PUT", limitPath(name), rule.fields, admin = true)

    /** Limit `name` as stored; [NotFound] if there is none. */
    suspend fun get(name: String): Map<String, Any?> = client.request("GET", limitPath(name), null, admin = true)

    /** Every limit in force, the rules' version, and the rows that failed validation. */
    suspend fun list(): LimitList {
        val body = client.request("GET", "/v1/limits", null, admin = true)
        @Suppress("UNCHECKED_CAST")
        return LimitList(
            body.long("version") ?: 0,
            (body["limits"] as? List<*>).orEmpty().filterIsInstance<Map<String, Any?>>(),
            (body["rejected"] as? List<*>).orEmpty().filterIsInstance<Map<String, Any?>>(),
        )
    }

    /** Remove limit `name`; [NotFound] if there is none. */
    suspend fun delete(name: String) {
        client.decodeEmpty(client.send("DELETE", limitPath(name), null, admin = true))
    }

    fun putAsync(name: String, rule: LimitRule): CompletableFuture<Map<String, Any?>> = client.async { put(name, rule) }
    fun getAsync(name: String): CompletableFuture<Map<String, Any?>> = client.async { get(name) }
    fun listAsync(): CompletableFuture<LimitList> = client.async { list() }
    fun deleteAsync(name: String): CompletableFuture<Unit> = client.async { delete(name) }

    @Throws(TimeoutException::class)
    fun putBlocking(name: String, rule: LimitRule, timeout: java.time.Duration): Map<String, Any?> = client.blocking(timeout) { put(name, rule) }

    @Throws(TimeoutException::class)
    fun getBlocking(name: String, timeout: java.time.Duration): Map<String, Any?> = client.blocking(timeout) { get(name) }

    @Throws(TimeoutException::class)
    fun listBlocking(timeout: java.time.Duration): LimitList = client.blocking(timeout) { list() }

    @Throws(TimeoutException::class)
    fun deleteBlocking(name: String, timeout: java.time.Duration) = client.blocking(timeout) { delete(name) }
}

/** An answer that may carry no body (a 204): the error it stands for, if any. */
internal fun TollgateClient.decodeEmpty(answer: Answer) {
    if (answer.status >= 400) throw errorFromAnswer(answer.status, answer.headers.firstValue("retry-after").orElse(null), answer.text)
}
