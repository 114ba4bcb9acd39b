package tollgate.client

/**
 * JSON as the wire needs it, and no more: objects as [Map], arrays as [List], strings, numbers
 * ([Long] when whole and in range, else [Double]), booleans and null. Hand-written so that the
 * client's one dependency is kotlinx-coroutines: the wire's bodies are small objects, and a
 * general library would add more code than this file to every application.
 */
internal object Json {
    /** Nesting deeper than this is refused: no answer of the server comes near it. */
    private const val DEPTH_MAX = 64

    fun write(value: Any?): String = StringBuilder().also { write(value, it) }.toString()

    private fun write(value: Any?, out: StringBuilder) {
        when (value) {
            null -> out.append("null")
            is String -> string(value, out)
            is Boolean -> out.append(value)
            is Int, is Long, is Short, is Byte -> out.append(value)
            is Double -> {
                require(value.isFinite()) { "JSON has no $value" }
                if (value == Math.rint(value) && kotlin.math.abs(value) < 1e15) out.append(value.toLong()) else out.append(value)
            }
            is Float -> write(value.toDouble(), out)
            is Number -> out.append(value.toString())
            is Map<*, *> -> {
                out.append('{')
                var first = true
                for ((key, item) in value) {
                    if (!first) out.append(',')
                    first = false
                    string(key.toString(), out)
                    out.append(':')
                    write(item, out)
                }
                out.append('}')
            }
            is Iterable<*> -> {
                out.append('[')
                var first = true
                for (item in value) {
                    if (!first) out.append(',')
                    first = false
                    write(item, out)
                }
                out.append(']')
            }
            is Array<*> -> write(value.asList(), out)
            else -> throw IllegalArgumentException("cannot write a ${value::class.java.name} as JSON")
        }
    }

    private fun string(text: String, out: StringBuilder) {
        out.append('"')
        for (char in text) {
            when {
                char == '"' -> out.append("\\\"")
                char == '\\' -> out.append("\\\\")
                char == '\n' -> out.append("\\n")
                char == '\r' -> out.append("\\r")
                char == '\t' -> out.append("\\t")
                char < ' ' -> out.append(String.format("\\u%04x", char.code))
                else -> out.append(char)
            }
        }
        out.append('"')
    }

    /** The value of `text`; [IllegalArgumentException] when it is not JSON. */
    fun read(text: String): Any? {
        val reader = Reader(text)
        reader.space()
        val value = reader.value(0)
        reader.space()
        if (reader.at < text.length) reader.fail("text after the value")
        return value
    }

    private class Reader(val text: String) {
        var at = 0

        fun fail(what: String): Nothing = throw IllegalArgumentException("not JSON: $what at offset $at")

        fun space() {
            while (at < text.length && text[at].let { it == ' ' || it == '\t' || it == '\n' || it == '\r' }) at++
        }

        fun value(depth: Int): Any? {
            if (depth > DEPTH_MAX) fail("nesting deeper than $DEPTH_MAX")
            if (at >= text.length) fail("end of text")
            return when (val char = text[at]) {
                '{' -> obj(depth)
                '[' -> array(depth)
                '"' -> string()
                't' -> literal("true", true)
                'f' -> literal("false", false)
                'n' -> literal("null", null)
                else -> if (char == '-' || char in '0'..'9') number() else fail("unexpected '$char'")
            }
        }

        fun literal(word: String, value: Any?): Any? {
            if (!text.startsWith(word, at)) fail("unexpected text")
            at += word.length
            return value
        }

        fun obj(depth: Int): Map<String, Any?> {
            at++
            val out = LinkedHashMap<String, Any?>()
            space()
            if (at < text.length && text[at] == '}') {
                at++
                return out
            }
            while (true) {
                space()
                if (at >= text.length || text[at] != '"') fail("expected a key")
                val key = string()
                space()
                if (at >= text.length || text[at] != ':') fail("expected ':'")
                at++
                space()
                out[key] = value(depth + 1)
                space()
                if (at >= text.length) fail("end of text in an object")
                when (text[at++]) {
                    ',' -> continue
                    '}' -> return out
                    else -> fail("expected ',' or '}'")
                }
            }
        }

        fun array(depth: Int): List<Any?> {
            at++
            val out = ArrayList<Any?>()
            space()
            if (at < text.length && text[at] == ']') {
                at++
                return out
            }
            while (true) {
                space()
                out.add(value(depth + 1))
                space()
                if (at >= text.length) fail("end of text in an array")
                when (text[at++]) {
                    ',' -> continue
                    ']' -> return out
                    else -> fail("expected ',' or ']'")
                }
            }
        }

        fun string(): String {
            at++
            val out = StringBuilder()
            while (true) {
                if (at >= text.length) fail("unterminated string")
                val char = text[at++]
                when {
                    char == '"' -> return out.toString()
                    char == '\\' -> {
                        if (at >= text.length) fail("unterminated escape")
                        when (val escaped = text[at++]) {
                            '"', '\\', '/' -> out.append(escaped)
                            'b' -> out.append('\b')
                            'f' -> out.append('\u000c')
                            'n' -> out.append('\n')
                            'r' -> out.append('\r')
                            't' -> out.append('\t')
                            'u' -> {
                                if (at + 4 > text.length) fail("short \\u escape")
                                val code = text.substring(at, at + 4).toIntOrNull(16) ?: fail("bad \\u escape")
                                out.append(code.toChar())
                                at += 4
                            }
                            else -> fail("bad escape")
                        }
                    }
                    char < ' ' -> fail("control character in a string")
                    else -> out.append(char)
                }
            }
        }

        fun number(): Number {
            val start = at
            if (text[at] == '-') at++
            while (at < text.length && text[at] in '0'..'9') at++
            var whole = true
            if (at < text.length && text[at] == '.') {
                whole = false
                at++
                while (at < text.length && text[at] in '0'..'9') at++
            }
            if (at < text.length && (text[at] == 'e' || text[at] == 'E')) {
                whole = false
                at++
                if (at < text.length && (text[at] == '+' || text[at] == '-')) at++
                while (at < text.length && text[at] in '0'..'9') at++
            }
            val literal = text.substring(start, at)
            if (whole) literal.toLongOrNull()?.let { return it }
            return literal.toDoubleOrNull() ?: fail("bad number '$literal'")
        }
    }
}

/** A field of a JSON object as a number, or null. */
internal fun Map<String, Any?>.number(name: String): Double? = (this[name] as? Number)?.toDouble()

internal fun Map<String, Any?>.long(name: String): Long? = (this[name] as? Number)?.toLong()

@Suppress("UNCHECKED_CAST")
internal fun Map<String, Any?>.obj(name: String): Map<String, Any?>? = this[name] as? Map<String, Any?>
