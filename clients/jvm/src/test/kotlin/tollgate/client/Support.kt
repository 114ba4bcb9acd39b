package tollgate.client

import java.io.File
import java.net.URI
import java.net.http.HttpClient
import java.net.http.HttpRequest
import java.net.http.HttpResponse
import java.nio.file.Files
import java.nio.file.Path
import java.nio.file.Paths
import java.util.UUID
import java.util.concurrent.TimeUnit

/**
 * Test support: Tollgate servers started from the real binary (`TOLLGATE_BIN`, else a cargo
 * build of this repository), and the shared vectors read from the repository.
 */
object Support {
    const val ADMIN_TOKEN = "admin-token-for-tests"

    /** The repository: the tests run in clients/jvm. */
    val repository: Path = Paths.get(System.getProperty("user.dir")).toAbsolutePath().parent.parent

    fun vectors(vararg parts: String): Map<String, Any?> {
        @Suppress("UNCHECKED_CAST")
        return Json.read(Files.readString(repository.resolve(Paths.get(parts[0], *parts.drop(1).toTypedArray())))) as Map<String, Any?>
    }

    fun unique(prefix: String = "t") = "$prefix-${UUID.randomUUID().toString().replace("-", "").take(12)}"

    /** The `tollgate` binary: TOLLGATE_BIN, else target/{debug,release}/tollgate of CARGO_TARGET_DIR or the repository. */
    fun binary(): String {
        System.getenv("TOLLGATE_BIN")?.takeIf { it.isNotEmpty() }?.let {
            require(File(it).canExecute()) { "TOLLGATE_BIN=$it is not an executable file" }
            return it
        }
        val targets = listOfNotNull(System.getenv("CARGO_TARGET_DIR")?.takeIf { it.isNotEmpty() }, repository.resolve("target").toString())
        for (target in targets) for (profile in listOf("debug", "release")) {
            val candidate = File(target, "$profile/tollgate")
            if (candidate.canExecute()) return candidate.path
        }
        throw IllegalStateException("no tollgate binary: set TOLLGATE_BIN to the path of a built `tollgate` (cargo build -p tollgate-cli)")
    }

    private val plain: HttpClient = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build()

    fun get(url: String): HttpResponse<String> =
        plain.send(HttpRequest.newBuilder(URI(url)).timeout(java.time.Duration.ofSeconds(10)).build(), HttpResponse.BodyHandlers.ofString())
}

/** A `tollgate serve` on a free loopback port, in a directory of its own. */
class Server private constructor(val url: String, val directory: Path, private val process: Process, private val log: File) : AutoCloseable {
    companion object {
        /** Start one with `args` besides the listener and rules, and `env` besides the admin token (a null value takes a variable away). */
        fun start(args: List<String> = emptyList(), env: Map<String, String?> = emptyMap(), listen: String = "127.0.0.1:0"): Server {
            val directory = Files.createTempDirectory("tollgate-jvm-")
            val log = directory.resolve("server.log").toFile()
            val out = directory.resolve("stdout").toFile()
            val builder = ProcessBuilder(listOf(Support.binary(), "serve", "--listen", listen, "--rules", "sqlite://${directory.resolve("rules.db")}") + args)
                .directory(directory.toFile())
                .redirectOutput(out)
                .redirectError(log)
            val environment = builder.environment()
            // Nothing of the caller's Tollgate settings leaks in.
            environment.keys.filter { it.startsWith("TOLLGATE_") }.forEach { environment.remove(it) }
            environment["TOLLGATE_ADMIN_TOKEN"] = Support.ADMIN_TOKEN
            for ((name, value) in env) if (value == null) environment.remove(name) else environment[name] = value
            val process = builder.start()
            val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60)
            var url: String
            while (true) {
                val found = Regex("listening on (\\S+)").find(out.readText())?.groupValues?.get(1)
                if (found != null) {
                    url = found
                    break
                }
                check(process.isAlive) { "tollgate serve exited early (${process.exitValue()}):\n${log.readText()}" }
                check(System.nanoTime() < deadline) { "tollgate serve printed no address:\n${log.readText()}" }
                Thread.sleep(20)
            }
            val server = Server(url.trimEnd('/'), directory, process, log)
            while (true) {
                try {
                    if (Support.get("${server.url}/readyz").statusCode() == 200) return server
                } catch (_: java.io.IOException) {
                }
                if (System.nanoTime() > deadline) {
                    server.close()
                    throw IllegalStateException("tollgate serve not ready:\n${log.readText()}")
                }
                Thread.sleep(50)
            }
        }
    }

    fun client(token: String? = Support.ADMIN_TOKEN) = TollgateClient(url = url, token = token)

    val port: Int get() = URI(url).port

    override fun close() {
        if (process.isAlive) {
            process.destroy()
            if (!process.waitFor(30, TimeUnit.SECONDS)) process.destroyForcibly().waitFor()
        }
        directory.toFile().deleteRecursively()
    }
}
