package tollgate.client

import java.net.Inet6Address
import java.net.InetAddress
import java.net.URI
import java.nio.file.Files
import java.nio.file.LinkOption
import java.nio.file.Path
import java.nio.file.Paths
import java.nio.file.attribute.PosixFilePermission
import java.security.MessageDigest
import java.security.SecureRandom
import javax.crypto.Mac
import javax.crypto.spec.SecretKeySpec

/**
 * The admin token a local `tollgate serve` makes when none is configured, as the `tollgate`
 * commands find it: `TOLLGATE_ADMIN_TOKEN`, else the copy the server keeps for its user at
 * `$XDG_STATE_HOME/tollgate/servers/PORT.admin-token` (default `~/.local/state`), refused when
 * others could have read or written it. A kept token is sent only to the server that wrote it:
 * at the address it recorded (never where a name such as `localhost` leads now), and only once
 * the server there has proved it holds it (`GET /v1/admin-token/proof`). The proof's constants
 * are the server's, held alike by `crates/cli/tests/vectors/kept_token.json`.
 */
object Kept {
    /** The endpoint where a server proves it holds the admin token. */
    const val PROOF_PATH = "/v1/admin-token/proof"

    /** Its query parameter for the nonce. */
    const val PROOF_NONCE_PARAMETER = "nonce"

    /** What the proof's key is derived under. */
    const val PROOF_LABEL = "tollgate admin-token proof v1"

    private val random = SecureRandom()

    /** Where the server listening on `port` keeps its token for this user's programs. */
    @JvmStatic
    @JvmOverloads
    fun userCopyPath(port: Int, environment: (String) -> String? = System::getenv): Path? {
        var state = environment("XDG_STATE_HOME") ?: ""
        if (!state.startsWith("/")) {
            val home = environment("HOME") ?: ""
            if (!home.startsWith("/")) return null
            state = Paths.get(home, ".local", "state").toString()
        }
        return Paths.get(state, "tollgate", "servers", "$port.admin-token")
    }

    /** An IP address literal (never a name: nothing is looked up), or null. */
    private fun literal(text: String): InetAddress? {
        if (text.contains(':')) {
            if (!text.all { it.isLetterOrDigit() || it == ':' || it == '.' }) return null
            return try {
                InetAddress.getByName(text)
            } catch (_: Exception) {
                null
            }
        }
        val parts = text.split('.')
        if (parts.size != 4) return null
        val bytes = ByteArray(4)
        for ((index, part) in parts.withIndex()) {
            if (part.isEmpty() || part.length > 3 || !part.all { it in '0'..'9' }) return null
            val value = part.toInt()
            if (value > 255) return null
            bytes[index] = value.toByte()
        }
        return InetAddress.getByAddress(bytes)
    }

    private fun loopback(address: InetAddress) = address.isLoopbackAddress &&
        (address is Inet6Address || address.address[0] == 127.toByte())

    private fun unspecified(address: InetAddress) = address.isAnyLocalAddress

    /** `http(s)://HOST:PORT/...` as host and port; the port defaults to the scheme's. */
    private fun hostPort(url: String): Pair<String, Int>? {
        val uri = try {
            URI(url)
        } catch (_: Exception) {
            return null
        }
        val scheme = uri.scheme?.lowercase() ?: return null
        if (scheme != "http" && scheme != "https") return null
        val host = uri.host?.removePrefix("[")?.removeSuffix("]") ?: return null
        val port = if (uri.port >= 0) uri.port else if (scheme == "https") 443 else 80
        return host to port
    }

    /** `ADDRESS:PORT` split, the address without brackets and a literal; null when it is not one. */
    private fun listenParts(listen: String): Pair<InetAddress, String>? {
        val colon = listen.lastIndexOf(':')
        if (colon < 0) return null
        val port = listen.substring(colon + 1)
        if (port.isEmpty() || !port.all { it in '0'..'9' }) return null
        val address = literal(listen.substring(0, colon).removePrefix("[").removeSuffix("]")) ?: return null
        return address to port
    }

    /**
     * Whether a token whose server listens on `listen` may be sent to `url`: only to that
     * server, at its own port over loopback or at the exact address it listens on.
     */
    @JvmStatic
    fun belongsTo(listen: String?, url: String): Boolean {
        if (listen == null) return false
        val (host, port) = hostPort(url) ?: return false
        val (bound, boundPort) = listenParts(listen) ?: return false
        if (boundPort.toIntOrNull() != port) return false
        if (host.lowercase() == "localhost") return loopback(bound) || unspecified(bound)
        val asked = literal(host) ?: return false
        return asked == bound || (loopback(asked) && unspecified(bound))
    }

    /** Where to reach the server that recorded `listen`: as written, loopback for one bound to all addresses. */
    @JvmStatic
    fun connectAddress(listen: String): String? {
        var (bound, port) = listenParts(listen) ?: return null
        if (unspecified(bound)) bound = literal(if (bound is Inet6Address) "::1" else "127.0.0.1")!!
        return if (bound is Inet6Address) "[${compact(bound)}]:$port" else "${bound.hostAddress}:$port"
    }

    /** An IPv6 address as usually written (`::1`, not `0:0:0:0:0:0:0:1`). */
    private fun compact(address: Inet6Address): String {
        val groups = address.hostAddress.substringBefore('%').split(':').map { it.toInt(16).toString(16) }
        var bestStart = -1
        var bestLength = 0
        var index = 0
        while (index < groups.size) {
            if (groups[index] == "0") {
                val start = index
                while (index < groups.size && groups[index] == "0") index++
                if (index - start > bestLength && index - start > 1) {
                    bestStart = start
                    bestLength = index - start
                }
            } else {
                index++
            }
        }
        if (bestStart < 0) return groups.joinToString(":")
        return groups.subList(0, bestStart).joinToString(":") + "::" +
            groups.subList(bestStart + bestLength, groups.size).joinToString(":")
    }

    /** `url` with its host and port replaced by the address the server recorded; null when the token does not belong to `url`. */
    @JvmStatic
    fun baseFor(listen: String?, url: String): String? {
        if (listen == null || !belongsTo(listen, url)) return null
        val connect = connectAddress(listen) ?: return null
        val separator = url.indexOf("://")
        if (separator < 0) return null
        val rest = url.substring(separator + 3)
        val end = listOf('/', '?', '#').map { rest.indexOf(it) }.filter { it >= 0 }.minOrNull() ?: rest.length
        return url.substring(0, separator) + "://" + connect + rest.substring(end)
    }

    private fun hmac(key: ByteArray, message: ByteArray): ByteArray {
        val mac = Mac.getInstance("HmacSHA256")
        mac.init(SecretKeySpec(key, "HmacSHA256"))
        return mac.doFinal(message)
    }

    /**
     * The proof, in hex, that the holder of `token` listening on `listen` answers to `nonce`:
     * HMAC-SHA256 of `listen`, a newline and `nonce`, keyed by HMAC-SHA256 of the label keyed
     * by the token.
     */
    @JvmStatic
    fun proof(token: String, listen: String, nonce: String): String {
        val key = hmac(token.toByteArray(), PROOF_LABEL.toByteArray())
        return hmac(key, "$listen\n$nonce".toByteArray()).joinToString("") { "%02x".format(it) }
    }

    /** A fresh nonce: 32 random bytes in hex. */
    @JvmStatic
    fun proofNonce(): String = ByteArray(32).also(random::nextBytes).joinToString("") { "%02x".format(it) }

    /** Whether `answer` (the proof endpoint's JSON) proves `token` for `listen` and `nonce`, compared in constant time. */
    @JvmStatic
    fun proved(token: String, listen: String, nonce: String, answer: Any?): Boolean {
        val given = (answer as? Map<*, *>)?.get("proof") as? String ?: return false
        return MessageDigest.isEqual(given.toByteArray(), proof(token, listen, nonce).toByteArray())
    }

    /** `TOLLGATE_ADMIN_TOKEN`, sent wherever the client is told. */
    internal fun givenAdminToken(): String? = System.getenv("TOLLGATE_ADMIN_TOKEN")?.ifEmpty { null }

    /** A kept token that belongs to a URL: where it was read, and where to send it. */
    class KeptToken internal constructor(val token: String, val listen: String, val path: Path, val base: String) {
        fun refusal(why: String): String =
            "not sending the admin token kept in $path: the server at $base did not prove that it holds it ($why); " +
                "the file may be left by a server that has stopped, and another program may listen on its port"

        override fun toString() = "KeptToken($path, $base)"
    }

    /**
     * The token a local server keeps for this user that belongs to the server at `url`, as the
     * `tollgate` commands find it; the caller must have it proved before sending it.
     * [SecurityException] when the file could have been read or planted by another user.
     */
    @JvmStatic
    @JvmOverloads
    fun keptAdminToken(url: String, environment: (String) -> String? = System::getenv): KeptToken? {
        val (_, port) = hostPort(url) ?: return null
        val path = userCopyPath(port, environment) ?: return null
        if (!Files.exists(path, LinkOption.NOFOLLOW_LINKS) && !Files.exists(path)) return null
        val text: String
        val permissions: Set<PosixFilePermission>
        val owner: String
        try {
            permissions = Files.getPosixFilePermissions(path)
            owner = Files.getOwner(path).name
            text = Files.readString(path)
        } catch (_: java.io.IOException) {
            return null
        }
        val others = permissions - setOf(PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE)
        val me = System.getProperty("user.name")
        if (others.isNotEmpty() || owner != me) {
            throw SecurityException(
                "admin token file $path could have been read or planted by another user (permissions " +
                    "${java.nio.file.attribute.PosixFilePermissions.toString(permissions)}, owner $owner); make it 0600 and yours, or remove it",
            )
        }
        val lines = text.split('\n').map { it.trim() }.filter { it.isNotEmpty() }
        if (lines.isEmpty()) return null
        val listen = lines.drop(1).filter { it.startsWith("listen ") }.lastOrNull()?.removePrefix("listen ")?.trim() ?: return null
        val base = baseFor(listen, url) ?: return null
        return KeptToken(lines[0], listen, path, base)
    }
}
