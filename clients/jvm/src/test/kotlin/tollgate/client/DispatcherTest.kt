package tollgate.client

import kotlinx.coroutines.async
import kotlinx.coroutines.delay
import kotlinx.coroutines.runBlocking
import okhttp3.OkHttpClient
import okhttp3.Request
import okhttp3.RequestBody.Companion.toRequestBody
import org.junit.jupiter.api.AfterAll
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.BeforeAll
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.TestInstance
import java.net.URI
import java.net.http.HttpClient
import java.net.http.HttpRequest
import java.net.http.HttpResponse
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds

/**
 * The dispatcher against the real binary and vendors in this process, through both faces:
 * the `java.net.http.HttpClient` wrapper and the OkHttp interceptor.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class DispatcherTest {
    private lateinit var server: Server
    private lateinit var client: TollgateClient

    @BeforeAll
    fun start() {
        server = Server.start()
        client = server.client()
    }

    @AfterAll
    fun stop() = server.close()

    private suspend fun rate(limit: Long = 1000, period: java.time.Duration = java.time.Duration.ofMinutes(1)) =
        Support.unique("vendor").also { client.limits.put(it, LimitRule.rate(limit, period)) }

    /** A vendor that answers in turn (the last repeats). */
    private fun scripted(vararg answers: Pair<Int, Map<String, String>>) =
        CountingVendor(answer = { _, call -> answers[minOf(call, answers.size) - 1] })

    private fun wrapper(vendor: CountingVendor, name: String, options: (DispatchOptions) -> DispatchOptions = { it }) =
        TollgateHttpClient(
            HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build(),
            Dispatcher(client, options(DispatchOptions(mapOf(vendor.host to listOf(name)), backoff = 10.milliseconds, learn = false))),
        )

    private fun get(url: String) = HttpRequest.newBuilder(URI(url)).build()

    @Test
    fun `a 429 with Retry-After pauses the limit fleet-wide, then the call is retried`() = runBlocking<Unit> {
        val name = rate()
        scripted(429 to mapOf("retry-after" to "2"), 200 to emptyMap()).use { vendor ->
            val http = wrapper(vendor, name)
            val call = async { http.sendSuspending(get("${vendor.url}/x"), HttpResponse.BodyHandlers.ofString()) }
            delay(700.milliseconds)
            // Another process, asking the server alone, is held by the pause.
            val held = assertThrows(RateLimited::class.java) { runBlocking { client.acquire(name) } }
            assertEquals("paused", held.reason)
            assertTrue(held.retryAfter > 0.5.seconds)
            val response = call.await()
            assertEquals(200, response.statusCode())
            assertEquals(2, vendor.calls())
            assertTrue(vendor.arrivals[1] - vendor.arrivals[0] >= 2000, "the retry waited out the pause: ${vendor.arrivals}")
        }
    }

    @Test
    fun `transient failures are retried for idempotent methods only, and the last answer returned`() = runBlocking<Unit> {
        val name = rate()
        scripted(503 to emptyMap(), 502 to emptyMap(), 200 to emptyMap()).use { vendor ->
            val http = wrapper(vendor, name)
            assertEquals(200, http.send(get("${vendor.url}/x"), HttpResponse.BodyHandlers.ofString()).statusCode())
            assertEquals(3, vendor.calls())
        }
        scripted(503 to emptyMap(), 200 to emptyMap()).use { vendor ->
            val post = HttpRequest.newBuilder(URI("${vendor.url}/x")).POST(HttpRequest.BodyPublishers.ofString("{}")).build()
            assertEquals(503, wrapper(vendor, name).send(post, HttpResponse.BodyHandlers.ofString()).statusCode())
            assertEquals(1, vendor.calls())
        }
        scripted(500 to emptyMap()).use { vendor ->
            val http = wrapper(vendor, name) { it.copy(retriesMax = 2) }
            assertEquals(500, http.send(get("${vendor.url}/x"), HttpResponse.BodyHandlers.ofString()).statusCode())
            assertEquals(3, vendor.calls(), "the first attempt and 2 retries")
        }
    }

    @Test
    fun `no quota within waitMax is RateLimited and nothing is sent, and unmapped hosts pass untouched`() = runBlocking<Unit> {
        val name = rate(1)
        client.acquire(name).commit()
        scripted(200 to emptyMap()).use { vendor ->
            val http = wrapper(vendor, name) { it.copy(waitMax = 300.milliseconds) }
            assertThrows(RateLimited::class.java) { http.send(get("${vendor.url}/x"), HttpResponse.BodyHandlers.ofString()) }
            assertEquals(0, vendor.calls())
            val other = wrapper(vendor, name) { it.copy(hosts = mapOf("elsewhere.example" to listOf(name))) }
            assertEquals(200, other.send(get("${vendor.url}/x"), HttpResponse.BodyHandlers.ofString()).statusCode())
            assertEquals(1, vendor.calls())
        }
    }

    @Test
    fun `the vendor's rate-limit headers teach the server its limit`() = runBlocking<Unit> {
        val name = rate(50)
        scripted(200 to mapOf("ratelimit-policy" to "\"min\";q=5;w=60")).use { vendor ->
            val http = wrapper(vendor, name) { it.copy(learn = true) }
            assertEquals(200, http.send(get("${vendor.url}/x"), HttpResponse.BodyHandlers.ofString()).statusCode())
        }
        var granted = 1
        while (client.tryAcquire(name) != null) granted++
        assertEquals(5, granted, "the limit in force is the vendor's 5 a minute")
    }

    @Test
    fun `the OkHttp interceptor pauses on a 429 and retries, at the request's priority`() = runBlocking<Unit> {
        val name = rate()
        scripted(429 to mapOf("retry-after" to "1"), 200 to emptyMap()).use { vendor ->
            val dispatcher = Dispatcher(client, DispatchOptions(mapOf(vendor.host to listOf(name)), learn = false))
            val http = OkHttpClient.Builder().addInterceptor(TollgateInterceptor(dispatcher)).build()
            val request = Request.Builder().url("${vendor.url}/x").tag(Priority::class.java, Priority.HIGH).build()
            http.newCall(request).execute().use { response ->
                assertEquals(200, response.code)
                assertEquals("{}", response.body.string())
            }
            assertEquals(2, vendor.calls())
            assertTrue(vendor.arrivals[1] - vendor.arrivals[0] >= 1000)
        }
        scripted(429 to mapOf("retry-after" to "1"), 200 to emptyMap()).use { vendor ->
            val dispatcher = Dispatcher(client, DispatchOptions(mapOf(vendor.host to listOf(name)), learn = false))
            val http = OkHttpClient.Builder().addInterceptor(TollgateInterceptor(dispatcher)).build()
            val request = Request.Builder().url("${vendor.url}/x").post("{}".toRequestBody()).build()
            http.newCall(request).execute().use { assertEquals(200, it.code, "a POST is retried after a rate-limit answer") }
        }
        scripted(429 to mapOf("retry-after" to "1")).use { vendor ->
            val dispatcher = Dispatcher(client, DispatchOptions(mapOf(vendor.host to listOf(name)), learn = false))
            val http = OkHttpClient.Builder().addInterceptor(TollgateInterceptor(dispatcher)).build()
            val oneShot = object : okhttp3.RequestBody() {
                override fun contentType() = null
                override fun isOneShot() = true
                override fun writeTo(sink: okio.BufferedSink) {
                    sink.writeUtf8("{}")
                }
            }
            // A one-shot body is sent once: its 429 comes back as the vendor gave it.
            http.newCall(Request.Builder().url("${vendor.url}/x").post(oneShot).build()).execute().use { assertEquals(429, it.code) }
            assertEquals(1, vendor.calls())
        }
    }
}
