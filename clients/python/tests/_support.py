"""Test support: Tollgate servers started from the real binary, the judging mock vendor
(``tollgate-mock-vendor``, also a real binary), and in-process mock vendors for what it does
not do. Shared by the fixtures and by the worker processes of the fleet tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

ADMIN_TOKEN = "admin-token-for-tests"
# Startup and shutdown bounds: generous, the machine may be small and busy.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0

_REPOSITORY = Path(__file__).resolve().parents[3]


def unique(prefix: str = "t") -> str:
    """A limit name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def find_binary() -> str:
    """The `tollgate` binary: $TOLLGATE_BIN, else a cargo build of this repository, else PATH."""
    given = os.environ.get("TOLLGATE_BIN")
    if given:
        if not os.access(given, os.X_OK):
            raise RuntimeError(f"TOLLGATE_BIN={given!r} is not an executable file")
        return given
    targets = [Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    targets.append(_REPOSITORY / "target")
    for target in targets:
        for profile in ("debug", "release"):
            candidate = target / profile / "tollgate"
            if os.access(candidate, os.X_OK):
                return str(candidate)
    on_path = shutil.which("tollgate")
    if on_path:
        return on_path
    raise RuntimeError(
        "no tollgate binary: set TOLLGATE_BIN to the path of a built `tollgate` "
        "(cargo build -p tollgate-cli), or put one on PATH"
    )


def find_mock_vendor_binary() -> str:
    """The `tollgate-mock-vendor` binary: $TOLLGATE_MOCK_VENDOR_BIN, else beside `tollgate`."""
    given = os.environ.get("TOLLGATE_MOCK_VENDOR_BIN")
    candidate = given or str(Path(find_binary()).parent / "tollgate-mock-vendor")
    if not os.access(candidate, os.X_OK):
        raise RuntimeError(
            f"no tollgate-mock-vendor at {candidate!r}: build it "
            "(cargo build -p tollgate-fleet --bin tollgate-mock-vendor) or set "
            "TOLLGATE_MOCK_VENDOR_BIN"
        )
    return candidate


@dataclass
class Server:
    """A `tollgate serve` process on a free loopback port."""

    url: str
    process: subprocess.Popen[bytes]
    directory: Path

    def log(self) -> str:
        return (self.directory / "stderr.log").read_text(errors="replace")

    def stop(self) -> int:
        """Stop it as an operator would (SIGTERM), killing it if it does not stop in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class ServerFactory:
    """Starts servers, each in a directory of its own, and stops them all at the end."""

    def __init__(self, binary: str, root: Path) -> None:
        self._binary = binary
        self._root = root
        self._servers: list[Server] = []

    def start(
        self,
        *args: str,
        env: dict[str, str | None] | None = None,
        listen: str = "127.0.0.1:0",
    ) -> Server:
        """A server on ``listen``; ``env`` adds settings, and a ``None`` value takes one away."""
        directory = self._root / uuid.uuid4().hex[:8]
        directory.mkdir(parents=True)
        # Nothing of the caller's Tollgate settings leaks in.
        environment = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_")}
        environment["TOLLGATE_ADMIN_TOKEN"] = ADMIN_TOKEN
        for name, value in (env or {}).items():
            if value is None:
                environment.pop(name, None)
            else:
                environment[name] = value
        command = [
            self._binary,
            "serve",
            "--listen",
            listen,
            "--rules",
            f"sqlite://{directory / 'rules.db'}",
            *args,
        ]
        stdout_path = directory / "stdout.log"
        with open(stdout_path, "wb") as stdout, open(directory / "stderr.log", "wb") as stderr:
            process = subprocess.Popen(
                command, cwd=directory, env=environment, stdout=stdout, stderr=stderr
            )
        server = Server(url="", process=process, directory=directory)
        self._servers.append(server)
        server.url = self._wait_for_address(server, stdout_path)
        self._wait_until_ready(server)
        return server

    @staticmethod
    def _wait_for_address(server: Server, stdout_path: Path) -> str:
        # The server prints "tollgate: listening on http://ADDRESS" once it accepts connections.
        deadline = time.monotonic() + START_TIMEOUT
        marker = "listening on "
        while time.monotonic() < deadline:
            for line in stdout_path.read_text(errors="replace").splitlines():
                if marker in line:
                    return line.split(marker, 1)[1].strip()
            if server.process.poll() is not None:
                raise RuntimeError(f"tollgate serve exited early:\n{server.log()}")
            time.sleep(0.02)
        raise RuntimeError(
            f"tollgate serve printed no address in {START_TIMEOUT} s:\n{server.log()}"
        )

    @staticmethod
    def _wait_until_ready(server: Server) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{server.url}/readyz", timeout=5.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if server.process.poll() is not None:
                raise RuntimeError(f"tollgate serve exited early:\n{server.log()}")
            time.sleep(0.05)
        raise RuntimeError(f"tollgate serve not ready in {START_TIMEOUT} s:\n{server.log()}")

    def close(self) -> None:
        for server in self._servers:
            server.stop()


# ---- the judging mock vendor -----------------------------------------------------------------


class MockVendor:
    """A `tollgate-mock-vendor` process: a vendor with a true limit that counts every arrival
    on its own clock and judges the callers (:meth:`report`)."""

    def __init__(
        self,
        binary: str,
        directory: Path,
        *,
        limit: int,
        period_ms: int,
        window: str,
        headers: str,
        retry_after_s: int | None = None,
    ) -> None:
        command = [
            binary,
            "--listen",
            "127.0.0.1:0",
            "--limit",
            str(limit),
            "--period-ms",
            str(period_ms),
            "--window",
            window,
            "--headers",
            headers,
        ]
        if retry_after_s is not None:
            command += ["--retry-after-s", str(retry_after_s)]
        directory.mkdir(parents=True, exist_ok=True)
        self._stderr = directory / "vendor-stderr.log"
        with open(self._stderr, "wb") as stderr:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=stderr, cwd=directory
            )
        self.url = self._wait_for_address()
        self._http = httpx.Client(base_url=self.url, timeout=30.0)

    def _wait_for_address(self) -> str:
        # The first stdout line is "listening on http://127.0.0.1:PORT".
        stdout = self.process.stdout
        assert stdout is not None
        result: list[str] = []
        reader = threading.Thread(
            target=lambda: result.append(stdout.readline().decode()), daemon=True
        )
        reader.start()
        reader.join(START_TIMEOUT)
        line = result[0] if result else ""
        marker = "listening on "
        if marker not in line:
            self.stop()
            raise RuntimeError(
                f"tollgate-mock-vendor printed {line!r}, not its address:\n"
                + self._stderr.read_text(errors="replace")
            )
        return line.split(marker, 1)[1].strip()

    @property
    def host(self) -> str:
        """``host:port``, as a transport's host map names it."""
        url = httpx.URL(self.url)
        return f"{url.host}:{url.port}"

    def report(self) -> dict[str, Any]:
        """The vendor's judgement: calls, ok, limited, most_in_any_window, used_share, ..."""
        answer = self._http.get("/_vendor/report")
        answer.raise_for_status()
        report: dict[str, Any] = answer.json()
        return report

    def set_limit(self, limit: int) -> None:
        self._http.post("/_vendor/limit", json={"limit": limit}).raise_for_status()

    def reset(self) -> None:
        self._http.post("/_vendor/reset").raise_for_status()

    def stop(self) -> None:
        if hasattr(self, "_http"):
            self._http.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def summary(report: dict[str, Any]) -> str:
    """A report's figures, without its arrival log, for assertion messages."""
    return json.dumps({k: v for k, v in report.items() if k != "arrivals_ms"})


class MockVendorFactory:
    """Starts judging mock vendors and stops them all at the end."""

    def __init__(self, binary: str, root: Path) -> None:
        self._binary = binary
        self._root = root
        self._vendors: list[MockVendor] = []

    def start(self, **options: Any) -> MockVendor:
        vendor = MockVendor(self._binary, self._root / uuid.uuid4().hex[:8], **options)
        self._vendors.append(vendor)
        return vendor

    def close(self) -> None:
        for vendor in self._vendors:
            vendor.stop()


# ---- in-process mock vendors ----------------------------------------------------------------


class _QuietHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def answer(self, status: int, headers: dict[str, str] | None = None) -> None:
        body = b"{}"
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@dataclass
class EscalatingVendor:
    """A vendor that, like Google Ads, answers 429 with a ``Retry-After`` and escalates the
    wait for every call that arrives during the cessation it announced.

    It announces a cessation of ``retry_after`` seconds at the calls numbered in
    ``announce_at`` (counting from 1), unless one is in force.
    """

    announce_at: frozenset[int]
    retry_after: int = 1
    calls: int = 0
    announced: int = 0
    escalations: int = 0
    _until: float = 0.0
    _current: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(self) -> tuple[int, dict[str, str]]:
        """The status and headers of the next call's answer."""
        with self.lock:
            now = time.monotonic()
            self.calls += 1
            if now < self._until:
                self.escalations += 1
                self._current *= 2
                self._until = now + self._current
                return 429, {"Retry-After": str(self._current)}
            if self.calls in self.announce_at:
                self.announced += 1
                self._current = self.retry_after
                self._until = now + self._current
                return 429, {"Retry-After": str(self._current)}
            return 200, {}

    def handle(self, handler: _QuietHandler) -> None:
        status, headers = self.decide()
        handler.answer(status, headers)

    def mock(self, request: httpx.Request) -> httpx.Response:
        """The same vendor as an httpx.MockTransport handler."""
        status, headers = self.decide()
        return httpx.Response(status, headers=headers, json={})


@contextlib.contextmanager
def serve_vendor(vendor: EscalatingVendor) -> Iterator[str]:
    """Serve ``vendor`` over HTTP on a free loopback port; yields its URL."""

    class Handler(_QuietHandler):
        def do_GET(self) -> None:
            vendor.handle(self)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(length)
            vendor.handle(self)

    class Listener(ThreadingHTTPServer):
        # The default backlog (5) drops connection attempts when a fleet connects at once,
        # and a dropped SYN is retried a second later: a delay at the vendor that no
        # limiter could account for.
        request_queue_size = 1024

    server = Listener(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="mock-vendor", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host!s}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
