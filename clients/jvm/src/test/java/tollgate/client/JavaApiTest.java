package tollgate.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeoutException;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

/** The Java face against the real binary: futures, blocking calls with a timeout, the same errors. */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class JavaApiTest {
  private static final Duration TIMEOUT = Duration.ofSeconds(10);
  private Server server;
  private TollgateClient client;

  @BeforeAll
  void start() {
    server = Server.Companion.start(List.of(), java.util.Map.of(), "127.0.0.1:0");
    client = TollgateClient.builder().url(server.getUrl()).token(Support.ADMIN_TOKEN).build();
  }

  @AfterAll
  void stop() {
    server.close();
  }

  private String rate(long limit) throws Exception {
    String name = Support.INSTANCE.unique("java");
    client.limits().putBlocking(name, LimitRule.rate(limit, Duration.ofMinutes(1)), TIMEOUT);
    return name;
  }

  @Test
  void futuresAndBlockingCallsAcquireAndCommit() throws Exception {
    String name = rate(3);
    Permit permit = client.acquireAsync(List.of(name), AcquireOptions.defaults().cost(2)).get();
    assertEquals(1, permit.getLimits().get(0).getRemaining());
    assertEquals(1, permit.commitAsync(1L).get().getRefunded());
    Permit blocking = client.acquireBlocking(List.of(name), new AcquireOptions().priority(Priority.HIGH), TIMEOUT);
    blocking.commitBlocking(null, TIMEOUT);
    // 1 of the first 2 refunded, 1 more taken: 1 of 3 left.
    assertNotNull(client.tryAcquireBlocking(List.of(name), AcquireOptions.defaults(), TIMEOUT));
    assertNull(client.tryAcquireBlocking(List.of(name), AcquireOptions.defaults(), TIMEOUT));
  }

  @Test
  void errorsAreTheSameClasses() throws Exception {
    String name = rate(1);
    client.acquireBlocking(List.of(name), AcquireOptions.defaults(), TIMEOUT).commitBlocking(null, TIMEOUT);
    ExecutionException failed =
        assertThrows(ExecutionException.class, () -> client.acquireAsync(name).get());
    RateLimited limited = assertInstanceOf(RateLimited.class, failed.getCause());
    assertEquals("capacity", limited.getReason());
    assertTrue(limited.retryAfterDuration().toMillis() > 0);
    assertThrows(NotFound.class, () -> client.limits().getBlocking(Support.INSTANCE.unique("none"), TIMEOUT));
  }

  @Test
  void aBlockingWaitGivesUpAtItsTimeoutAndCountsNothing() throws Exception {
    String name = Support.INSTANCE.unique("java-lease");
    client.limits().putBlocking(name, LimitRule.concurrency(1, Duration.ofMinutes(1)), TIMEOUT);
    Permit held = client.acquireBlocking(List.of(name), AcquireOptions.defaults(), TIMEOUT);
    AcquireOptions waiting = AcquireOptions.defaults().waitFor(Duration.ofSeconds(30));
    assertThrows(TimeoutException.class, () -> client.acquireBlocking(List.of(name), waiting, Duration.ofMillis(300)));
    CompletableFuture<Permit> future = client.acquireAsync(List.of(name), waiting);
    Thread.sleep(300);
    future.cancel(true);
    held.releaseAsync().get();
    Permit next = client.tryAcquireBlocking(List.of(name), AcquireOptions.defaults(), TIMEOUT);
    assertNotNull(next, "neither given-up wait took the lease");
    next.releaseAsync().get();
  }

  @Test
  void withPermitCommitsOnSuccessAndNothingOnFailure() throws Exception {
    String name = rate(10);
    String answer =
        client.withPermitBlocking(List.of(name), AcquireOptions.defaults().cost(4), TIMEOUT, permit -> {
          permit.setUsed(1L);
          return "done";
        });
    assertEquals("done", answer);
    assertThrows(IllegalStateException.class, () ->
        client.withPermitBlocking(List.of(name), AcquireOptions.defaults().cost(4), TIMEOUT, permit -> {
          throw new IllegalStateException("the call failed");
        }));
    CompletableFuture<String> async =
        client.withPermitAsync(List.of(name), AcquireOptions.defaults(), permit -> CompletableFuture.completedFuture("ok"));
    assertEquals("ok", async.get());
    // 1 + 4 + 1 units spent of 10: 4 left.
    int left = 0;
    while (client.tryAcquireBlocking(List.of(name), AcquireOptions.defaults(), TIMEOUT) != null) left++;
    assertEquals(4, left);
  }

  /** The README's Java quick start, as written there but for the server's address and token. */
  @Test
  void theJavaQuickStartRuns() throws Exception {
    var tollgate = TollgateClient.builder().url(server.getUrl()).token(Support.ADMIN_TOKEN).build();
    var timeout = Duration.ofSeconds(10);
    tollgate.limits().putBlocking("vendor-x", LimitRule.rate(10, Duration.ofSeconds(1)), timeout);
    Permit permit = tollgate.acquireBlocking(List.of("vendor-x"), AcquireOptions.defaults().waitFor(Duration.ofSeconds(5)), timeout);
    try { /* call the vendor */ } finally { permit.commitBlocking(null, timeout); }
    tollgate.acquireAsync(List.of("vendor-x"), AcquireOptions.defaults()).thenCompose(p -> p.commitAsync(null)).join();
  }

  @Test
  void pauseAndCheck() throws Exception {
    String name = rate(10);
    assertTrue(client.pauseBlocking(name, Duration.ofSeconds(20), null, TIMEOUT).toMillis() > 19_000);
    CheckResult result = client.checkBlocking("GET", "/nothing/matches/" + name, null, TIMEOUT);
    assertTrue(result.getAllowed());
    assertEquals(List.of(), result.getMatched());
  }
}
