package tollgate.client

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.DynamicTest
import org.junit.jupiter.api.DynamicTest.dynamicTest
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.TestFactory
import java.nio.file.Paths
import kotlin.time.Duration.Companion.seconds

/**
 * The rules every implementation shares, on the shared vectors read from the repository:
 * Retry-After and the default verdicts (crates/dispatch/tests/vectors/retry_after.json), the
 * vendor's rate-limit headers (vendor_headers.json), and where a kept admin token goes
 * (crates/cli/tests/vectors/kept_token.json).
 */
class VectorsTest {
    private val retryAfter = Support.vectors("crates", "dispatch", "tests", "vectors", "retry_after.json")
    private val now = (retryAfter["now"] as Number).toLong()

    @Suppress("UNCHECKED_CAST")
    private fun cases(map: Map<String, Any?>, name: String) = map[name] as List<Map<String, Any?>>

    /** A header value as an HTTP stack hands it over: each byte one character (Latin-1). */
    private fun wire(value: String) = String(value.toByteArray(Charsets.UTF_8), Charsets.ISO_8859_1)

    @TestFactory
    fun `the shared Retry-After vectors`(): List<DynamicTest> {
        val cases = cases(retryAfter, "retry_after")
        assertTrue(cases.size > 20, "the vectors were read")
        return cases.map { case ->
            dynamicTest(Json.write(case)) {
                val hex = case["hex"] as String?
                val value = if (hex != null) String(hex.chunked(2).map { it.toInt(16).toByte() }.toByteArray(), Charsets.ISO_8859_1) else wire(case["value"] as String)
                val read = RetryAfter.parse(value, now)
                if (case["saturates"] == true) {
                    assertTrue(read != null && read >= (1L shl 53), "read $read")
                } else {
                    assertEquals((case["seconds"] as Number?)?.toLong(), read)
                }
            }
        }
    }

    @TestFactory
    fun `the shared verdict vectors`(): List<DynamicTest> = cases(retryAfter, "verdicts").map { case ->
        dynamicTest(Json.write(case)) {
            val expected = when (case["verdict"]) {
                "rate_limited" -> Verdict.RateLimited((case["seconds"] as Number?)?.toLong())
                "retry" -> Verdict.Retry
                else -> Verdict.Done
            }
            assertEquals(expected, Verdict.of((case["status"] as Number).toInt(), case["retry_after"] as String?, now))
        }
    }

    @TestFactory
    fun `the shared vendor header vectors`(): List<DynamicTest> {
        val vectors = Support.vectors("crates", "dispatch", "tests", "vectors", "vendor_headers.json")
        val cases = cases(vectors, "cases")
        assertTrue(cases.size > 50, "the vectors were read")
        return cases.map { case ->
            dynamicTest(case["name"] as String) {
                val headers = (case["headers"] as List<*>).map { it as List<*> }.map { (it[0] as String) to wire(it[1] as String) }
                val lookup = { name: String -> headers.filter { it.first.equals(name, ignoreCase = true) }.map { it.second } }
                val advice = VendorAdvice.read(lookup, (case["now_ms"] as Number).toLong())
                val got = advice?.let {
                    mapOf(
                        "family" to it.family,
                        "quotas" to it.quotas.map { quota -> mapOf("quota" to quota.quota, "window_ms" to quota.windowMs) },
                        "remaining" to it.remaining,
                        "reset_ms" to it.resetMs,
                    )
                }
                assertEquals(Json.read(Json.write(case["advice"])), Json.read(Json.write(got)), Json.write(case["headers"]))
            }
        }
    }

    private val kept = Support.vectors("crates", "cli", "tests", "vectors", "kept_token.json")

    @Test
    fun `a kept token goes where the shared vectors say`() {
        val cases = cases(kept, "belongs")
        assertTrue(cases.size > 20, "the vectors were read")
        for (case in cases) {
            assertEquals(case["sends"], Kept.belongsTo(case["listen"] as String?, case["url"] as String), Json.write(case))
        }
        for (case in cases(kept, "connect")) {
            assertEquals(case["base"], Kept.baseFor(case["listen"] as String?, case["url"] as String), Json.write(case))
        }
    }

    @Test
    fun `the user's copy is looked for where the shared vectors say`() {
        for (case in cases(kept, "user_copy")) {
            val path = Kept.userCopyPath((case["port"] as Number).toInt()) { name -> case[name] as String? }
            assertEquals(case["path"], path?.toString(), Json.write(case))
        }
    }

    @Test
    fun `the proof's constants and answers are the shared ones`() {
        @Suppress("UNCHECKED_CAST")
        val proof = kept["proof"] as Map<String, Any?>
        assertEquals(proof["path"], Kept.PROOF_PATH)
        assertEquals(proof["nonce_parameter"], Kept.PROOF_NONCE_PARAMETER)
        assertEquals(proof["label"], Kept.PROOF_LABEL)
        val nonce = Kept.proofNonce()
        assertTrue(nonce.length in (proof["nonce_hex_min"] as Number).toInt()..(proof["nonce_hex_max"] as Number).toInt())
        val cases = cases(proof, "cases")
        assertTrue(cases.size >= 5)
        for (case in cases) {
            val (token, listen, once) = listOf(case["token"] as String, case["listen"] as String, case["nonce"] as String)
            assertEquals(case["proof"], Kept.proof(token, listen, once))
            assertTrue(Kept.proved(token, listen, once, mapOf("proof" to case["proof"])))
            assertFalse(Kept.proved(token, listen, once, mapOf("proof" to "0".repeat(64))))
            assertFalse(Kept.proved(token, listen, once, null))
        }
    }

    @Test
    fun `pauses are at least the vendor's wait, capped, and none for Retry-After 0`() {
        val policy = Policy(DispatchOptions(mapOf("api.vendor.example" to listOf("vendor-x"))))
        repeat(200) {
            assertTrue(policy.pauseFor(15)!! in 15.seconds..15.25.seconds)
            assertTrue(policy.pauseFor(null)!! in 30.seconds..30.25.seconds)
            assertTrue(policy.pauseFor(Long.MAX_VALUE)!! in 900.seconds..900.25.seconds)
        }
        assertNull(policy.pauseFor(0))
        for (attempt in 0 until 20) {
            val full = minOf(0.1 * Math.pow(2.0, attempt.toDouble()), 5.0).seconds
            repeat(20) { assertTrue(policy.backoff(attempt) in full / 2..full) }
        }
    }

    @Test
    fun `hosts match with the port first, without case`() {
        val policy = Policy(DispatchOptions(mapOf("API.vendor.example" to listOf("any-port"), "api.vendor.example:8443" to listOf("one", "two"))))
        assertEquals(listOf("one", "two"), policy.hostFor("api.vendor.example", 8443)!!.names)
        assertEquals("one", policy.hostFor("api.vendor.example", 8443)!!.pauseTarget)
        assertEquals(listOf("any-port"), policy.hostFor("API.Vendor.Example", -1)!!.names)
        assertEquals(listOf("any-port"), policy.hostFor("api.vendor.example", 443)!!.names)
        assertNull(policy.hostFor("elsewhere.example", -1))
    }

    @Test
    fun `a configuration out of range is refused naming the option`() {
        val base = DispatchOptions(mapOf("api.vendor.example" to listOf("vendor-x")))
        val cases = listOf(
            base.copy(hosts = emptyMap()) to "hosts",
            base.copy(hosts = mapOf("a" to emptyList())) to "limits",
            base.copy(waitMax = 0.seconds) to "waitMax",
            base.copy(retriesMax = 101) to "retriesMax",
            base.copy(retriesMax = -1) to "retriesMax",
            base.copy(backoff = 6.seconds) to "backoff",
            base.copy(retryAfterDefault = 0.seconds) to "retryAfterDefault",
            base.copy(retryAfterDefault = 1000.seconds) to "retryAfterDefault",
            base.copy(retryAfterMax = 86_400.seconds) to "retryAfterMax",
            base.copy(resumeJitterMax = (-1).seconds) to "resumeJitterMax",
        )
        for ((options, name) in cases) {
            val error = assertThrows(IllegalArgumentException::class.java) { Policy(options) }
            assertTrue(error.message!!.startsWith("$name:"), error.message)
        }
    }

    @Test
    fun `JSON reads and writes what the wire carries`() {
        val text = """{"a":[1,-2.5,"x\"\u00e9\n",true,false,null],"b":{"c":12345678901234}}"""
        val value = Json.read(text)
        assertEquals(mapOf("a" to listOf(1L, -2.5, "x\"é\n", true, false, null), "b" to mapOf("c" to 12345678901234L)), value)
        assertEquals(value, Json.read(Json.write(value)))
        for (bad in listOf("", "{", "[1,]", "{\"a\" 1}", "tru", "\"\\x\"", "1 2")) {
            assertThrows(IllegalArgumentException::class.java, { Json.read(bad) }, bad)
        }
        assertEquals(Paths.get("x"), Paths.get("x"))
    }
}
