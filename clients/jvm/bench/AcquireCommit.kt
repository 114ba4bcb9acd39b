// Acquire+commit pairs per second through the JVM client, against a running server:
// `java -cp ... tollgate.client.bench.AcquireCommitKt URL TOKEN LIMIT SECONDS CONCURRENCY [WARMUP]`.
// Each of CONCURRENCY coroutines acquires one unit of LIMIT and commits it, one pair after
// another, for WARMUP seconds (default 0: the JVM compiles the hot code meanwhile) and then
// for SECONDS, measured; prints one JSON line {client, concurrency, pairs, seconds, pairs_per_s}.
// Run by scripts/bench-clients beside the Python and TypeScript clients' twins.
package tollgate.client.bench

import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import tollgate.client.TollgateClient
import java.util.concurrent.atomic.AtomicLong

fun main(args: Array<String>) {
    val (url, token, limit, seconds, concurrency) = args
    val warmup = args.getOrNull(5)?.toDouble() ?: 0.0
    val client = TollgateClient(url = url, token = token)
    fun run(forSeconds: Double): Pair<Long, Double> {
        val pairs = AtomicLong()
        val started = System.nanoTime()
        val end = started + (forSeconds * 1e9).toLong()
        runBlocking(Dispatchers.Default) {
            repeat(concurrency.toInt()) {
                launch {
                    while (System.nanoTime() < end) {
                        client.acquire(limit).commit(1)
                        pairs.incrementAndGet()
                    }
                }
            }
        }
        return pairs.get() to (System.nanoTime() - started) / 1e9
    }
    if (warmup > 0) run(warmup)
    val (pairs, elapsed) = run(seconds.toDouble())
    println("""{"client": "jvm", "concurrency": $concurrency, "pairs": $pairs, "seconds": $elapsed, "pairs_per_s": ${pairs / elapsed}}""")
    System.exit(0)
}
