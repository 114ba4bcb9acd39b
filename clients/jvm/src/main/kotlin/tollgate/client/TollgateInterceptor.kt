package tollgate.client

import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.runInterruptible
import okhttp3.Interceptor
import okhttp3.Response

/**
 * The [Dispatcher] as an OkHttp application interceptor
 * (`OkHttpClient.Builder().addInterceptor(TollgateInterceptor(dispatcher))`): requests to a
 * mapped host take its quota first and turn the vendor's rate-limit answers into a pause of the
 * whole fleet; others pass untouched. A request's priority is its tag of type [Priority]
 * (`Request.Builder().tag(Priority::class.java, Priority.HIGH)`).
 *
 * OkHttp's interceptors block their thread, so a request waiting for quota holds it: with
 * `enqueue`, raise `Dispatcher.maxRequestsPerHost` (default 5) to the concurrency wanted.
 * OkHttp is a `provided` dependency: an application that uses this brings its own.
 */
class TollgateInterceptor(val dispatcher: Dispatcher) : Interceptor {
    override fun intercept(chain: Interceptor.Chain): Response {
        val request = chain.request()
        val url = request.url
        val host = dispatcher.hostFor(url.host, url.port) ?: return chain.proceed(request)
        val body = request.body
        return runBlocking {
            dispatcher.dispatch(
                host,
                "${url.host}:${url.port}",
                request.method,
                body == null || !body.isOneShot(),
                request.tag(Priority::class.java),
                send = { runInterruptible(Dispatchers.IO) { chain.proceed(request) } },
                view = { response ->
                    object : VendorAnswer {
                        override val status = response.code
                        override fun header(name: String): List<String> = response.headers(name)
                    }
                },
                discard = { it.close() },
            )
        }
    }
}
