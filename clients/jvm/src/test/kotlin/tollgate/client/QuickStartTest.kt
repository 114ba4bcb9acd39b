package tollgate.client

import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Test
import kotlin.time.Duration.Companion.seconds

/** The README's Kotlin quick start, as written there but for the server's address and token. */
class QuickStartTest {
    @Test
    fun `the Kotlin quick start runs`() {
        Server.start().use { server ->
            runBlocking {
                val tollgate = TollgateClient(url = server.url, token = Support.ADMIN_TOKEN)
                tollgate.limits.put("vendor-x", LimitRule.rate(10, java.time.Duration.ofSeconds(1)))
                val answer = tollgate.withPermit("vendor-x", wait = 5.seconds) { permit ->
                    permit.used = 1
                    "called the vendor"
                }
                assertEquals("called the vendor", answer)
            }
        }
    }
}
