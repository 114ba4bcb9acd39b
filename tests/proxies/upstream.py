"""The application behind the proxies in scripts/proxy-test: answers every request 200 and
counts what it receives, by method, by the `X-Api-Key` it came with and in all. Knows nothing
of Tollgate: the count is the test's judge of what the proxy let through.

GET /__count on its own port (not through the proxy) answers the counts as JSON and is not
counted. Usage: upstream.py PORT; prints "listening" once it accepts.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

counts: Counter[str] = Counter()
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, body: bytes, send_body: bool = True) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def count(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with lock:
            counts["all"] += 1
            counts[f"method:{self.command}"] += 1
            counts[f"key:{self.headers.get('X-Api-Key', '')}"] += 1
            # What reached the application of the proxy's own headers: never the token.
            if self.headers.get("X-Tollgate-Token") is not None:
                counts["saw-token"] += 1
        self.answer(b'{"ok":true}\n', send_body=self.command != "HEAD")

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        if self.path == "/__count":
            with lock:
                body = json.dumps(dict(counts)).encode()
            self.answer(body)
            return
        self.count()

    do_HEAD = do_POST = do_PUT = do_DELETE = count  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
