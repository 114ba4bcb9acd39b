package tollgate.client

import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.util.concurrent.TimeUnit

/**
 * Two JVM processes of 60 coroutines each call a vendor through the dispatcher; the vendor
 * answers 429 with `Retry-After: 2` once, 13 s after its first call. Judged by the vendor alone,
 * on its own clock: no call arrives during the cessation, no window of its limit ever holds
 * more than the limit, and the calls in the 10 s after the cessation are within 10 % of those
 * in the 10 s before it: the fleet paused together without losing its concurrency.
 */
class FleetTest {
    @Test
    fun `two processes of 60 coroutines pause together at one 429 and resume at full speed`() = scenario(latencyMs = 0)

    private fun scenario(latencyMs: Long) {
        val processes = 2
        val concurrency = 60
        val limit = 20L
        val periodMs = 1000L
        val refuseAfterMs = 13_000L
        val retryAfterS = 2L
        val runSeconds = 28
        Server.start().use { server ->
            val client = server.client()
            val rate = Support.unique("vendor")
            val flight = Support.unique("flight")
            runBlocking {
                // The vendor's limit, with a margin for the spread between a grant and its
                // arrival (two JVMs on a small, shared machine: scheduling alone can delay one
                // call by a few hundred ms); and one call in flight, so that a pause is recorded
                // before the next call may leave.
                client.limits.put(rate, LimitRule.rate(limit, java.time.Duration.ofMillis(periodMs)).with("margin_ms", 500))
                client.limits.put(flight, LimitRule.concurrency(1, java.time.Duration.ofMinutes(1)))
            }
            CountingVendor(refuseAfterMs = refuseAfterMs, retryAfterS = retryAfterS, latencyMs = latencyMs).use { vendor ->
                val java = File(System.getProperty("java.home"), "bin/java").path
                val classPath = System.getProperty("java.class.path")
                val start = System.currentTimeMillis() + 4_000
                val workers = (1..processes).map {
                    ProcessBuilder(
                        java, "-cp", classPath, "tollgate.client.FleetWorker",
                        server.url, "$rate,$flight", vendor.url, "$concurrency", "$runSeconds", "$start",
                    ).redirectErrorStream(true).start()
                }
                val outputs = workers.map { worker ->
                    val text = worker.inputStream.bufferedReader().readText()
                    assertTrue(worker.waitFor(120, TimeUnit.SECONDS), "a worker did not finish")
                    assertEquals(0, worker.exitValue(), text)
                    text
                }
                val results = outputs.map { @Suppress("UNCHECKED_CAST") (Json.read(it.trim().lines().last()) as Map<String, Any?>) }
                val announced = vendor.announcedAt
                assertNotNull(announced, "the vendor announced its cessation")
                val before = vendor.between(announced!! - 10_000, announced)
                val ceased = announced + retryAfterS * 1000
                val after = vendor.between(ceased, ceased + 10_000)
                val (most, mostAt) = vendor.mostInAnyWindow(periodMs.toDouble())
                val report = "fleet (vendor latency $latencyMs ms): $processes processes x $concurrency coroutines; vendor calls ${vendor.calls()}; " +
                    "429 at ${"%.0f".format(announced)} ms; calls during the cessation: ${vendor.duringCessation.size} " +
                    "${vendor.duringCessation.map { "%.1f".format(it - announced) }}; 10 s before: $before, 10 s after: $after " +
                    "(${"%+.1f".format((after - before) * 100.0 / before)} %); most in any ${periodMs} ms: $most (limit $limit, from ${"%.0f".format(mostAt - announced)} ms); " +
                    "statuses ${results.map { it["statuses"] }}; errors ${results.flatMap { it["errors"] as List<*> }}"
                val around = synchronized(vendor) { vendor.arrivals.filter { it > announced - 1500 && it < announced + 2500 } }
                println(report + "\naround the 429 (ms from it): " + around.joinToString(" ") { "%.0f".format(it - announced) })
                File("target").mkdirs()
                File("target/fleet-report.txt").appendText(report + "\n")
                assertEquals(emptyList<Any>(), results.flatMap { it["errors"] as List<*> }, report)
                assertEquals(0, vendor.duringCessation.size, "no call during the cessation: $report")
                assertTrue(most <= limit, "never more than the limit in a window: $report")
                assertTrue(before >= 80, "the fleet ran at the limit before: $report")
                assertTrue(Math.abs(after - before) <= before * 0.10, "throughput after within 10 % of before: $report")
            }
        }
    }
}
