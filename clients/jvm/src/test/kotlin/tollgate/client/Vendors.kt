package tollgate.client

import com.sun.net.httpserver.HttpExchange
import com.sun.net.httpserver.HttpServer
import java.net.InetSocketAddress
import java.util.concurrent.Executors

/**
 * A vendor on a loopback port that counts every call's arrival on its own clock (this JVM's
 * `System.nanoTime`, since its start) and never takes Tollgate's word for anything.
 *
 * It answers 200, except: once, at the first call at least [refuseAfterMs] after the first
 * call, 429 with `Retry-After: [retryAfterS]`, announcing a cessation of that many seconds, and
 * 429 with the seconds left to every call during it. [answer], when given, decides instead.
 */
class CountingVendor(
    private val refuseAfterMs: Long = Long.MAX_VALUE,
    private val retryAfterS: Long = 2,
    /** How long each call takes at the vendor after its arrival is counted. */
    private val latencyMs: Long = 0,
    private val answer: ((HttpExchange, Int) -> Pair<Int, Map<String, String>>)? = null,
) : AutoCloseable {
    private val started = System.nanoTime()
    private val server: HttpServer = HttpServer.create(InetSocketAddress("127.0.0.1", 0), 1024)
    private val lock = Object()

    /** Every arrival, ms since the vendor started, in order. */
    val arrivals = ArrayList<Double>()

    /** When the cessation was announced (ms), or null. */
    @Volatile
    var announcedAt: Double? = null
        private set

    /** Calls that arrived during the cessation, each answered 429. */
    val duringCessation = ArrayList<Double>()

    val url: String
    val host: String

    init {
        server.executor = Executors.newFixedThreadPool(16)
        server.createContext("/") { exchange -> handle(exchange) }
        server.start()
        host = "127.0.0.1:${server.address.port}"
        url = "http://$host"
    }

    private fun handle(exchange: HttpExchange) {
        exchange.requestBody.readAllBytes()
        val (status, headers) = synchronized(lock) {
            val at = (System.nanoTime() - started) / 1e6
            arrivals.add(at)
            val scripted = answer
            if (scripted != null) return@synchronized scripted(exchange, arrivals.size)
            val announced = announcedAt
            when {
                announced != null && at < announced + retryAfterS * 1000 -> {
                    duringCessation.add(at)
                    val left = Math.ceil((announced + retryAfterS * 1000 - at) / 1000).toLong()
                    429 to mapOf("retry-after" to left.toString())
                }
                announced == null && at - arrivals.first() >= refuseAfterMs -> {
                    announcedAt = at
                    429 to mapOf("retry-after" to retryAfterS.toString())
                }
                else -> 200 to emptyMap()
            }
        }
        if (latencyMs > 0) Thread.sleep(latencyMs)
        for ((name, value) in headers) exchange.responseHeaders.add(name, value)
        val body = "{}".toByteArray()
        exchange.sendResponseHeaders(status, body.size.toLong())
        exchange.responseBody.use { it.write(body) }
    }

    /** Arrivals in [from, to) ms. */
    fun between(from: Double, to: Double): Int = synchronized(lock) { arrivals.count { it >= from && it < to } }

    /** The most arrivals in any window of `periodMs`, and when (ms) the first such window began. */
    fun mostInAnyWindow(periodMs: Double): Pair<Int, Double> = synchronized(lock) {
        var most = 0
        var at = 0.0
        var first = 0
        for (index in arrivals.indices) {
            while (arrivals[index] - arrivals[first] >= periodMs) first++
            if (index + 1 - first > most) {
                most = index + 1 - first
                at = arrivals[first]
            }
        }
        most to at
    }

    fun calls(): Int = synchronized(lock) { arrivals.size }

    override fun close() {
        server.stop(0)
        (server.executor as java.util.concurrent.ExecutorService).shutdownNow()
    }
}
