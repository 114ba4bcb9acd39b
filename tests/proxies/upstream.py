"""The application behind the proxies in scripts/proxy-test: a WSGI application on the standard
library's wsgiref server, which routes on PATH_INFO (the decoded path, as every WSGI and ASGI
server gives it) and counts what it receives: requests by method, by the `X-Api-Key` they came
with and in all, and the runs of its one handler, `^/items/\\d+/?$` (other paths get 404).
Knows nothing of Tollgate: the counts are the test's judge of what the proxy let through.

GET /__count on its own port (not through the proxy) answers the counts as JSON and is not
counted. Usage: upstream.py PORT; prints "listening" once it accepts.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections import Counter
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

counts: Counter[str] = Counter()
lock = threading.Lock()
ITEM = re.compile(r"^/items/\d+/?$")


def application(environ, start_response):
    method = environ["REQUEST_METHOD"]
    path = environ.get("PATH_INFO", "")
    if path == "/__count":
        with lock:
            body = json.dumps(dict(counts)).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        environ["wsgi.input"].read(length)
    with lock:
        counts["all"] += 1
        counts[f"method:{method}"] += 1
        counts[f"key:{environ.get('HTTP_X_API_KEY', '')}"] += 1
        # What reached the application of the proxy's own headers: never the token.
        if environ.get("HTTP_X_TOLLGATE_TOKEN") is not None:
            counts["saw-token"] += 1
        routed = ITEM.match(path) is not None
        if routed:
            # The handler ran: what a limit on /items/{id} is there to bound.
            counts["handler:items"] += 1
            counts[f"handler:items:{environ.get('HTTP_X_API_KEY', '')}"] += 1
    if not routed:
        start_response("404 Not Found", [("Content-Type", "application/json")])
        return [] if method == "HEAD" else [b'{"error":"not found"}\n']
    start_response("200 OK", [("Content-Type", "application/json")])
    return [] if method == "HEAD" else [b'{"ok":true}\n']


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def main() -> None:
    server = make_server(
        "127.0.0.1", int(sys.argv[1]), application, server_class=Server, handler_class=Quiet
    )
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
