package tollgate.client

import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import java.net.URI
import java.net.http.HttpClient
import java.net.http.HttpRequest
import java.net.http.HttpResponse
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.atomic.AtomicInteger
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds

/**
 * One process of the fleet test: CONCURRENCY coroutines sharing one [TollgateHttpClient], each
 * calling the vendor through the dispatcher from START (ms since the epoch) for SECONDS.
 * Prints {"statuses": {...}, "errors": [...]} as its last line.
 *
 *     FleetWorker TOLLGATE_URL LIMITS VENDOR_URL CONCURRENCY SECONDS START
 */
object FleetWorker {
    @JvmStatic
    fun main(args: Array<String>) {
        val (tollgateUrl, limits, vendorUrl, concurrency, seconds, start) = args
        val client = TollgateClient(url = tollgateUrl, timeout = 30.seconds)
        val host = URI(vendorUrl).authority
        // The fleet's one rule: no learning (a refusal without quota headers would lower the
        // limit, which is not what this test measures); pauses and retries as by default.
        val options = DispatchOptions(mapOf(host to limits.split(",")), learn = false, retriesMax = 5)
        val http = TollgateHttpClient(HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build(), Dispatcher(client, options))
        val statuses = ConcurrentHashMap<Int, AtomicInteger>()
        val errors = java.util.Collections.synchronizedList(ArrayList<String>())
        runBlocking(Dispatchers.Default) {
            delay(maxOf(0, start.toLong() - System.currentTimeMillis()).milliseconds)
            val until = System.nanoTime() + seconds.toLong() * 1_000_000_000
            repeat(concurrency.toInt()) {
                launch {
                    while (System.nanoTime() < until) {
                        try {
                            val response = http.sendSuspending(HttpRequest.newBuilder(URI("$vendorUrl/call")).build(), HttpResponse.BodyHandlers.ofString())
                            statuses.computeIfAbsent(response.statusCode()) { AtomicInteger() }.incrementAndGet()
                        } catch (error: Exception) {
                            errors.add(error.toString())
                        }
                    }
                }
            }
        }
        println(Json.write(mapOf("statuses" to statuses.mapKeys { it.key.toString() }.mapValues { it.value.get() }, "errors" to errors.take(20))))
        System.exit(0)
    }
}

private operator fun <T> Array<T>.component6(): T = this[5]
