package tollgate.client

import kotlinx.coroutines.CoroutineStart
import kotlinx.coroutines.async
import kotlinx.coroutines.cancelAndJoin
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.AfterAll
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.BeforeAll
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.TestInstance
import java.nio.file.Files
import java.nio.file.attribute.PosixFilePermissions
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.minutes
import kotlin.time.Duration.Companion.seconds

/** The client against the real binary: the wire contract, its errors, and cancellation. */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class ClientTest {
    private lateinit var server: Server
    private lateinit var client: TollgateClient

    @BeforeAll
    fun start() {
        server = Server.start()
        client = server.client()
    }

    @AfterAll
    fun stop() = server.close()

    private suspend fun rate(limit: Long = 3, period: java.time.Duration = java.time.Duration.ofMinutes(1)): String =
        Support.unique("rate").also { client.limits.put(it, LimitRule.rate(limit, period)) }

    private suspend fun lease(limit: Long = 1): String =
        Support.unique("lease").also { client.limits.put(it, LimitRule.concurrency(limit, java.time.Duration.ofMinutes(1))) }

    /** The units left, read by a grant given back whole. */
    private suspend fun remaining(name: String): Long {
        val permit = client.tryAcquire(name) ?: return 0
        permit.commit(0)
        return permit.limits.single().remaining + 1
    }

    @Test
    fun `acquire, commit and the limits' state`() = runBlocking<Unit> {
        val name = rate(3)
        val permit = client.acquire(name, cost = 2)
        assertEquals(1, permit.limits.single().remaining)
        assertEquals(name, permit.limits.single().name)
        assertTrue(permit.limits.single().resetAfter > 0.seconds)
        assertNull(permit.fence)
        assertEquals(Committed(refunded = 1, released = 0), permit.commit(1))
        assertEquals(2, remaining(name))
        assertThrows(Conflict::class.java) { runBlocking { permit.commit() } }
    }

    @Test
    fun `tryAcquire answers null and acquire throws RateLimited with retryAfter and reason`() = runBlocking<Unit> {
        val name = rate(1)
        client.acquire(name).commit()
        assertNull(client.tryAcquire(name))
        val denied = assertThrows(RateLimited::class.java) { runBlocking { client.acquire(listOf(name)) } }
        assertEquals("capacity", denied.reason)
        assertEquals("rate_limited", denied.code)
        assertEquals(429, denied.status)
        assertTrue(denied.retryAfter > 0.seconds && denied.retryAfter <= 1.minutes, "${denied.retryAfter}")
        assertEquals(name, denied.limits.single().name)
    }

    @Test
    fun `withPermit commits used on a normal exit and nothing on an exception`() = runBlocking<Unit> {
        val name = rate(10)
        val answer = client.withPermit(name, cost = 4) { permit ->
            permit.used = 1
            "done"
        }
        assertEquals("done", answer)
        assertEquals(9, remaining(name), "used 1 of 4: 3 refunded")
        assertThrows(IllegalStateException::class.java) {
            runBlocking { client.withPermit(name, cost = 4) { permit -> permit.used = 1; throw IllegalStateException("the call failed") } }
        }
        assertEquals(5, remaining(name), "nothing committed: all 4 stay spent")
        // A lease is released on an exception.
        val leased = lease(1)
        assertThrows(IllegalStateException::class.java) {
            runBlocking { client.withPermit(leased) { throw IllegalStateException("boom") } }
        }
        val next = client.acquire(leased)
        assertNotNull(next.fence)
        next.release()
    }

    @Test
    fun `a lease is renewed, released, and fenced`() = runBlocking<Unit> {
        val name = lease(1)
        val first = client.acquire(name)
        assertTrue(first.renew() > 50.seconds)
        assertNull(client.tryAcquire(name))
        assertEquals(1, first.release().released)
        val second = client.acquire(name)
        assertTrue(second.fence!! > first.fence!!)
        second.commit()
    }

    @Test
    fun `pause holds every grant with reason paused`() = runBlocking<Unit> {
        val name = rate(100)
        val left = client.pause(name, 30.seconds)
        assertTrue(left > 29.seconds && left <= 30.seconds, "$left")
        val denied = assertThrows(RateLimited::class.java) { runBlocking { client.acquire(name) } }
        assertEquals("paused", denied.reason)
        assertTrue(denied.retryAfter > 28.seconds)
    }

    @Test
    fun `check applies the limits that match`() = runBlocking<Unit> {
        val name = Support.unique("check")
        client.limits.put(name, LimitRule.rate(1, java.time.Duration.ofMinutes(1)).with("match", mapOf("method" to "GET", "path" to "/$name/entity/#")).with("per", "user"))
        val first = client.check("GET", "/$name/entity/12", user = "ann")
        assertTrue(first.allowed)
        assertEquals("/$name/entity/#", first.path)
        assertEquals(listOf(name), first.matched)
        val second = client.check("GET", "/$name/entity/13", user = "ann")
        assertFalse(second.allowed)
        assertEquals("capacity", second.reason)
        assertTrue(second.retryAfter!! > 0.seconds)
        assertTrue(client.check("GET", "/$name/entity/1", user = "bob").allowed, "counted per user")
    }

    @Test
    fun `the admin API puts, gets, lists and deletes`() = runBlocking<Unit> {
        val name = Support.unique("admin")
        val stored = client.limits.put(name, LimitRule.rate(5, java.time.Duration.ofSeconds(1)))
        assertEquals(5L, stored["limit"])
        assertEquals(name, client.limits.get(name)["name"])
        assertTrue(client.limits.list().limits.any { it["name"] == name })
        client.limits.delete(name)
        assertThrows(NotFound::class.java) { runBlocking { client.limits.get(name) } }
        assertThrows(NotFound::class.java) { runBlocking { client.limits.delete(name) } }
    }

    @Test
    fun `one exception per wire code`() = runBlocking<Unit> {
        val name = rate(1)
        val bad = assertThrows(BadRequest::class.java) { runBlocking { client.acquire(name, cost = 0) } }
        assertEquals("cost", bad.field)
        assertEquals(400, bad.status)
        assertThrows(NotFound::class.java) { runBlocking { client.acquire(Support.unique("missing")) } }
        val wrong = TollgateClient(url = server.url, token = "wrong-token")
        assertThrows(Unauthorized::class.java) { runBlocking { wrong.limits.list() } }
        val bogus = client.acquire(name)
        bogus.commit()
        assertThrows(Conflict::class.java) { runBlocking { bogus.commit() } }
        val down = TollgateClient(url = "http://127.0.0.1:9", timeout = 2.seconds)
        val unreachable = assertThrows(ServerUnreachable::class.java) { runBlocking { down.acquire(name) } }
        assertEquals("unreachable", unreachable.code)
        assertThrows(IllegalArgumentException::class.java) { runBlocking { client.acquire(emptyList()) } }
        assertThrows(IllegalArgumentException::class.java) { runBlocking { client.acquire(name, wait = (-1).seconds) } }
        // Every class sits under TollgateException; Forbidden under Unauthorized.
        assertTrue(Forbidden("x") is Unauthorized)
        for (error in listOf(BadRequest("x"), NotFound("x"), StoreUnavailable("x"), TooManyKeys("x"), Conflict("x"), ServerError("x"))) {
            assertTrue(error is TollgateException)
        }
    }

    @Test
    fun `a scoped data token beyond its scope is Forbidden`() = runBlocking<Unit> {
        val name = rate(10)
        val other = rate(10)
        val minted = client.request("POST", "/v1/tokens", mapOf("name" to Support.unique("tok"), "limits" to listOf(name)), admin = true)
        val scoped = TollgateClient(url = server.url, token = minted["secret"] as String)
        scoped.acquire(name).commit()
        val forbidden = assertThrows(Forbidden::class.java) { runBlocking { scoped.acquire(other) } }
        assertEquals("forbidden", forbidden.code)
    }

    @Test
    fun `cancelling a waiting acquire gives its wait up and counts nothing`() = runBlocking<Unit> {
        val name = lease(1)
        val held = client.acquire(name)
        val waiting = async(start = CoroutineStart.UNDISPATCHED) { client.acquire(name, wait = 30.seconds) }
        delay(300.milliseconds)
        waiting.cancelAndJoin()
        assertTrue(waiting.isCancelled)
        held.release()
        // Had the cancelled wait been left at the server, it would take the lease now.
        val next = client.tryAcquire(name)
        assertNotNull(next, "the lease is free at once: the cancelled wait took nothing")
        assertTrue(next!!.fence!! > held.fence!!)
        next.release()
        // A rate limit: a cancelled wait leaves every unit.
        val units = rate(2)
        client.acquire(units, cost = 2).commit()
        val job = launch { client.acquire(units, wait = 50.seconds) }
        delay(300.milliseconds)
        job.cancelAndJoin()
        assertNull(client.tryAcquire(units), "nothing came back, nothing extra was spent")
    }

    @Test
    fun `the kept admin token is found, proved and sent to its own server alone`() = runBlocking<Unit> {
        val state = Files.createTempDirectory("tollgate-jvm-state-")
        Files.setPosixFilePermissions(state, PosixFilePermissions.fromString("rwx------"))
        Server.start(env = mapOf("TOLLGATE_ADMIN_TOKEN" to null, "XDG_STATE_HOME" to state.toString())).use { local ->
            val environment = { name: String -> if (name == "XDG_STATE_HOME") state.toString() else System.getenv(name) }
            val kept = Kept.keptAdminToken(local.url, environment)
            assertNotNull(kept, "the server keeps its token under XDG_STATE_HOME")
            val anonymous = TollgateClient(url = local.url)
            anonymous.environment = environment
            assertEquals(0L, anonymous.limits.list().limits.size.toLong())
            // Without the kept token, the admin API refuses.
            val elsewhere = TollgateClient(url = local.url)
            elsewhere.environment = { name -> if (name == "XDG_STATE_HOME") "/nonexistent" else System.getenv(name) }
            assertThrows(Unauthorized::class.java) { runBlocking { elsewhere.limits.list() } }
        }
        state.toFile().deleteRecursively()
    }
}
