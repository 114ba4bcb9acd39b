"""`tollgate serve` with Envoy's rate limit service on, started from TOLLGATE_BIN on free ports
(port 0, read back from its stdout lines) with an envoyproxy/ratelimit YAML configuration, and a
client made from Envoy's generated stubs (xds-protos)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# How long a server may take to print its listening lines, or to exit.
START_SECONDS = 30.0
STOP_SECONDS = 30.0
# One gRPC call.
CALL_SECONDS = 10.0

OK = rls_pb2.RateLimitResponse.OK
OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT

GRPC_LINE = re.compile(r"^tollgate: envoy rate limit service \(gRPC\) on (\S+):(\d+)$")
HTTP_LINE = re.compile(r"^tollgate: listening on http://(\S+):(\d+)$")

Entries = Sequence[tuple[str, str]]


def tollgate_bin() -> str:
    return os.environ["TOLLGATE_BIN"]


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a server: this one without any TOLLGATE_* setting that could change
    what the server does (a store, a listen address...), plus the admin token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_")}
    env["TOLLGATE_ADMIN_TOKEN"] = "x"
    env.setdefault("RUST_BACKTRACE", "1")
    if extra:
        env.update(extra)
    return env


def descriptor(entries: Entries) -> ratelimit_pb2.RateLimitDescriptor:
    return ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )


def request(domain: str, descriptors: Sequence[Entries], hits: int = 0) -> rls_pb2.RateLimitRequest:
    return rls_pb2.RateLimitRequest(
        domain=domain, descriptors=[descriptor(d) for d in descriptors], hits_addend=hits
    )


class Server:
    """One `tollgate serve` with the Envoy service on."""

    def __init__(self, config: Path, workdir: Path, args: Sequence[str] = ()) -> None:
        self.config = config
        self.workdir = workdir
        self.stderr_path = workdir / "stderr.log"
        self._stderr = open(self.stderr_path, "wb")
        command = [
            tollgate_bin(), "serve",
            "--listen", "127.0.0.1:0",
            "--grpc-listen", "127.0.0.1:0",
            "--envoy-config", str(config),
            *args,
        ]
        self.process = subprocess.Popen(
            command, cwd=workdir, env=server_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=self._stderr, text=True,
        )
        self.stopped = False
        self.stdout_lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        try:
            self.grpc_address, self.http_url = self._wait_listening()
            self.channel = grpc.insecure_channel(self.grpc_address)
            grpc.channel_ready_future(self.channel).result(timeout=START_SECONDS)
        except BaseException:
            self.kill()
            self._stderr.close()
            raise
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _wait_listening(self) -> tuple[str, str]:
        deadline = time.monotonic() + START_SECONDS
        grpc_address = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"tollgate did not print its listening lines within {START_SECONDS} s; "
                    f"stdout: {self.stdout_lines}\nstderr:\n{self.stderr()}"
                )
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                code = self.process.wait(timeout=STOP_SECONDS)
                raise AssertionError(
                    f"tollgate exited ({code}) before listening; stdout: {self.stdout_lines}\n"
                    f"stderr:\n{self.stderr()}"
                )
            self.stdout_lines.append(line)
            if match := GRPC_LINE.match(line):
                grpc_address = f"{match[1]}:{match[2]}"
            elif match := HTTP_LINE.match(line):
                assert grpc_address is not None, (
                    f"the gRPC line must come before the HTTP one: {self.stdout_lines}")
                return grpc_address, f"http://{match[1]}:{match[2]}"

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError as error:
            return f"(stderr unreadable: {error})"

    # ---- calls ----------------------------------------------------------------------------

    def ask(self, domain: str, descriptors: Sequence[Entries], hits: int = 0
            ) -> rls_pb2.RateLimitResponse:
        return self.stub.ShouldRateLimit(request(domain, descriptors, hits), timeout=CALL_SECONDS)

    def ask_raw(self, message: rls_pb2.RateLimitRequest) -> rls_pb2.RateLimitResponse:
        return self.stub.ShouldRateLimit(message, timeout=CALL_SECONDS)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.http_url + "/metrics", timeout=CALL_SECONDS) as answer:
            return answer.read().decode()

    def metric(self, name: str, labels: str) -> float:
        """The value of the sample `name{labels}`, e.g. metric("tollgate_envoy_decisions_total",
        'code="ok"'); 0 when the server does not show it (yet)."""
        pattern = re.compile(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", re.M)
        match = pattern.search(self.metrics())
        return float(match[1]) if match else 0.0

    # ---- stopping -------------------------------------------------------------------------

    def stop(self) -> int:
        """SIGTERM, and the exit code once it exited."""
        if self.stopped:
            return self.process.returncode
        self.stopped = True
        self.channel.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"tollgate did not stop within {STOP_SECONDS} s of SIGTERM")
        finally:
            self._stderr.close()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_SECONDS)


def run_to_exit(config: Path, workdir: Path) -> tuple[int, str, str]:
    """Start a server expected to refuse its configuration: its exit code, stdout, stderr."""
    command = [
        tollgate_bin(), "serve",
        "--listen", "127.0.0.1:0",
        "--grpc-listen", "127.0.0.1:0",
        "--envoy-config", str(config),
    ]
    process = subprocess.Popen(
        command, cwd=workdir, env=server_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        out, err = process.communicate(timeout=START_SECONDS)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=STOP_SECONDS)
        raise AssertionError(
            f"tollgate kept running on a configuration it should refuse\nstdout:\n{out}\n"
            f"stderr:\n{err}")
    return process.returncode, out, err


# ---- Redis, for cleaning up a test's namespace ----------------------------------------------


def _resp_command(*parts: str) -> bytes:
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _resp_read(reader) -> object:
    line = reader.readline()
    if not line:
        raise ConnectionError("Redis closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        length = int(rest)
        if length < 0:
            return None
        data = reader.read(length + 2)
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        count = int(rest)
        return None if count < 0 else [_resp_read(reader) for _ in range(count)]
    raise RuntimeError(f"unexpected Redis reply {line!r}")


def delete_redis_namespace(url: str, namespace: str) -> int:
    """Delete every key of a Tollgate namespace (`tg:{<tag>}:namespace:*`) from the Redis at `url`
    (redis://[user:password@]host[:port][/db]); the number of keys deleted."""
    import socket
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    deleted = 0
    with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379),
                                  timeout=CALL_SECONDS) as connection:
        reader = connection.makefile("rb")

        def call(*parts: str) -> object:
            connection.sendall(_resp_command(*parts))
            return _resp_read(reader)

        if parsed.password:
            if parsed.username:
                call("AUTH", unquote(parsed.username), unquote(parsed.password))
            else:
                call("AUTH", unquote(parsed.password))
        database = parsed.path.strip("/")
        if database:
            call("SELECT", database)
        cursor = "0"
        while True:
            reply = call("SCAN", cursor, "MATCH", f"tg:{{*}}:{namespace}:*", "COUNT", "1000")
            assert isinstance(reply, list)
            cursor, keys = reply
            if keys:
                deleted += int(call("DEL", *keys))  # type: ignore[arg-type]
            if cursor == "0":
                return deleted
