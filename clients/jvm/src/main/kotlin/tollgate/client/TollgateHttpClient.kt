package tollgate.client

import kotlinx.coroutines.future.await
import java.io.IOException
import java.net.Authenticator
import java.net.CookieHandler
import java.net.ProxySelector
import java.net.http.HttpClient
import java.net.http.HttpRequest
import java.net.http.HttpResponse
import java.util.Optional
import java.util.concurrent.CompletableFuture
import java.util.concurrent.CompletionException
import java.util.concurrent.ExecutionException
import java.util.concurrent.Executor
import javax.net.ssl.SSLContext
import javax.net.ssl.SSLParameters

/**
 * The [Dispatcher] as a `java.net.http.HttpClient`: `inner` sends, and requests to a mapped
 * host take its quota first and turn the vendor's rate-limit answers into a pause of the whole
 * fleet; others pass untouched. It is an [HttpClient], so code that takes one takes it; the
 * priority of one request is set with [send] or [sendAsync] taking a [Priority], and from
 * Kotlin [sendSuspending] waits without holding a thread.
 */
class TollgateHttpClient(private val inner: HttpClient, val dispatcher: Dispatcher) : HttpClient() {
    /** Send `request` through the dispatcher (a coroutine waits for quota without holding a thread). */
    suspend fun <T> sendSuspending(request: HttpRequest, handler: HttpResponse.BodyHandler<T>, priority: Priority? = null): HttpResponse<T> {
        val uri = request.uri()
        val host = uri.host?.let { dispatcher.hostFor(it.removePrefix("[").removeSuffix("]"), uri.port) }
            ?: return unwrap { inner.sendAsync(request, handler).await() }
        return dispatcher.dispatch(
            host,
            if (uri.port >= 0) "${uri.host}:${uri.port}" else uri.host,
            request.method(),
            // A body publisher is subscribed afresh for each attempt.
            true,
            priority,
            send = { unwrap { inner.sendAsync(request, handler).await() } },
            view = { response ->
                object : VendorAnswer {
                    override val status = response.statusCode()
                    override fun header(name: String): List<String> = response.headers().allValues(name)
                }
            },
            discard = { response -> (response.body() as? AutoCloseable)?.close() },
        )
    }

    /** The failure of a send as the blocking API throws it: an [IOException] stays one. */
    private suspend fun <R> unwrap(block: suspend () -> R): R = try {
        block()
    } catch (error: CompletionException) {
        throw error.cause ?: error
    }

    @Throws(IOException::class, InterruptedException::class)
    fun <T> send(request: HttpRequest, handler: HttpResponse.BodyHandler<T>, priority: Priority): HttpResponse<T> = blocking(request, handler, priority)

    @Throws(IOException::class, InterruptedException::class)
    private fun <T> blocking(request: HttpRequest, handler: HttpResponse.BodyHandler<T>, priority: Priority?): HttpResponse<T> =
        try {
            queued(request, handler, priority).get()
        } catch (error: ExecutionException) {
            when (val cause = error.cause) {
                is IOException -> throw cause
                is RuntimeException -> throw cause
                else -> throw IOException(cause)
            }
        }

    fun <T> sendAsync(request: HttpRequest, handler: HttpResponse.BodyHandler<T>, priority: Priority): CompletableFuture<HttpResponse<T>> =
        queued(request, handler, priority)

    private fun <T> queued(request: HttpRequest, handler: HttpResponse.BodyHandler<T>, priority: Priority?): CompletableFuture<HttpResponse<T>> =
        dispatcher.client.async { sendSuspending(request, handler, priority) }

    @Throws(IOException::class, InterruptedException::class)
    override fun <T> send(request: HttpRequest, handler: HttpResponse.BodyHandler<T>): HttpResponse<T> = blocking(request, handler, null)

    override fun <T> sendAsync(request: HttpRequest, handler: HttpResponse.BodyHandler<T>): CompletableFuture<HttpResponse<T>> =
        queued(request, handler, null)

    /** Push promises are the inner client's affair: this sends through the dispatcher without them. */
    override fun <T> sendAsync(
        request: HttpRequest,
        handler: HttpResponse.BodyHandler<T>,
        pushPromiseHandler: HttpResponse.PushPromiseHandler<T>?,
    ): CompletableFuture<HttpResponse<T>> = queued(request, handler, null)

    override fun cookieHandler(): Optional<CookieHandler> = inner.cookieHandler()
    override fun connectTimeout(): Optional<java.time.Duration> = inner.connectTimeout()
    override fun followRedirects(): Redirect = inner.followRedirects()
    override fun proxy(): Optional<ProxySelector> = inner.proxy()
    override fun sslContext(): SSLContext = inner.sslContext()
    override fun sslParameters(): SSLParameters = inner.sslParameters()
    override fun authenticator(): Optional<Authenticator> = inner.authenticator()
    override fun version(): Version = inner.version()
    override fun executor(): Optional<Executor> = inner.executor()
}
