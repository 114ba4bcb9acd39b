"""What every process of the soak agrees on: the limits, the record formats, small helpers.

Every time in the soak is wall-clock microseconds since the epoch: the decisions of the Redis
store are made on Redis's clock (`TIME`), which on one machine is the same clock as
``time.time_ns()`` in the workers and the vendor. Only the library workers started under
libfaketime see another time, and they report the store's time, never their own.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

#: The namespace of the soak's keys in its private Redis.
NAMESPACE = "soak"

#: Priorities, highest first.
PRIORITIES = ("high", "normal", "low")


@dataclass(frozen=True)
class RateLimit:
    """A rate limit of the soak, as the admin API takes it, plus what the oracle needs."""

    name: str
    limit: int
    period_ms: int
    algorithm: str
    burst: int | None = None
    margin_ms: int = 0
    reserve_high: int = 0
    reserve_normal: int = 0
    #: Also taken by library workers (`tollgate-fleet-worker`), whose policy has no margin,
    #: no reserve and no burst: the servers' rule must be the same policy.
    shared_with_library: bool = False

    def rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {
            "kind": "rate",
            "limit": self.limit,
            "period_ms": self.period_ms,
            "algorithm": self.algorithm,
        }
        if self.burst is not None:
            rule["burst"] = self.burst
        if self.margin_ms:
            rule["margin_ms"] = self.margin_ms
        if self.reserve_high or self.reserve_normal:
            rule["reserve"] = {"high": self.reserve_high, "normal": self.reserve_normal}
        return rule

    @property
    def window_us(self) -> int:
        """The window the algorithm counts in: the period plus the margin."""
        return (self.period_ms + self.margin_ms) * 1_000

    def bound(self) -> tuple[int, int]:
        """The most units the algorithm may grant in one window, and that window's width in
        microseconds (for gcra: the burst and what the rate adds in one period)."""
        if self.algorithm == "gcra":
            burst = self.burst if self.burst is not None else self.limit
            return burst + self.limit - 1, self.period_ms * 1_000
        return self.limit, self.window_us


@dataclass(frozen=True)
class ConcurrencyLimit:
    name: str
    limit: int
    lease_ttl_ms: int
    reserve_high: int = 0
    #: The vendor refuses a write whose fencing token is below one it has seen (a resource
    #: guarded by a lease of one).
    fenced: bool = False

    def rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {
            "kind": "concurrency",
            "limit": self.limit,
            "lease_ttl_ms": self.lease_ttl_ms,
        }
        if self.reserve_high:
            rule["reserve"] = {"high": self.reserve_high, "normal": 0}
        return rule


RATE_LIMITS: tuple[RateLimit, ...] = (
    RateLimit("vendor-sliding", 100, 1_000, "sliding", shared_with_library=True),
    RateLimit("vendor-fixed", 60, 1_000, "fixed", shared_with_library=True),
    # Scarce beside the demand of the servers' clients, so that priorities and reserves decide.
    RateLimit(
        "vendor-gcra", 10, 1_000, "gcra", burst=8, margin_ms=100, reserve_high=2, reserve_normal=2
    ),
    RateLimit(
        "vendor-tiered", 12, 1_000, "sliding", margin_ms=200, reserve_high=3, reserve_normal=3
    ),
)

CONCURRENCY_LIMITS: tuple[ConcurrencyLimit, ...] = (
    ConcurrencyLimit("conc", 3, 3_000, reserve_high=1),
    ConcurrencyLimit("mutex", 1, 2_000, fenced=True),
)

#: The limit flooded with distinct keys, on the Redis store (its counters expire one window
#: after their last use) and on a memory-store server with a key cap.
FLOOD_LIMIT = "flood"
FLOOD_RULE_REDIS: dict[str, Any] = {
    "kind": "rate",
    "limit": 5,
    "period_ms": 10_000,
    "per": "key",
}
FLOOD_RULE_CAPPED: dict[str, Any] = {
    "kind": "rate",
    "limit": 5,
    "period_ms": 60_000,
    "per": "key",
}

#: What the rate workers ask for: one limit, or several all or none.
RATE_REQUESTS: tuple[tuple[str, ...], ...] = (
    ("vendor-sliding",),
    ("vendor-fixed",),
    ("vendor-gcra",),
    ("vendor-tiered",),
    ("vendor-gcra", "vendor-fixed"),
    ("vendor-tiered", "vendor-sliding"),
)


def rate_limit(name: str) -> RateLimit:
    return next(limit for limit in RATE_LIMITS if limit.name == name)


def concurrency_limit(name: str) -> ConcurrencyLimit:
    return next(limit for limit in CONCURRENCY_LIMITS if limit.name == name)


def now_us() -> int:
    return time.time_ns() // 1_000


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


class Records:
    """A worker's record file: one line per event, written through at once, so that a worker
    killed with SIGKILL loses at most the line it was writing.

    Counted events (denials, errors) are summed per second and written once a second, as
    ``c <second> <kind> <detail> <count>``; the reader drops a torn last line.
    """

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", buffering=1, encoding="utf-8")
        self._counts: dict[tuple[str, str], int] = {}
        self._second = int(time.time())

    def line(self, text: str) -> None:
        self._file.write(text + "\n")

    def count(self, kind: str, detail: str = "-") -> None:
        second = int(time.time())
        if second != self._second:
            self.flush_counts()
            self._second = second
        key = (kind, detail)
        self._counts[key] = self._counts.get(key, 0) + 1

    def flush_counts(self) -> None:
        for (kind, detail), count in self._counts.items():
            self._file.write(f"c {self._second} {kind} {detail} {count}\n")
        self._counts.clear()

    def close(self) -> None:
        self.flush_counts()
        self._file.close()


class VendorLink:
    """A keep-alive connection to the mock vendor on which requests are pipelined: each is
    written at once, and its answer's status is delivered in order. Cheaper than an HTTP
    client library, so that the time from a grant to the vendor's receipt of the call is the
    worker's own, not its HTTP stack's."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._writer: asyncio.StreamWriter | None = None
        self._pending: collections.deque[asyncio.Future[int]] = collections.deque()
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()
        self._connects: set[asyncio.Task[None]] = set()

    @staticmethod
    def parse(url: str) -> VendorLink:
        host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
        return VendorLink(host, int(port))

    async def connect(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is None:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                self._writer = writer
                self._reader_task = asyncio.create_task(self._read(reader))
            return self._writer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                future = self._pending.popleft()
                if not future.done():
                    future.set_result(int(head[9:12]))
        except (OSError, asyncio.IncompleteReadError, IndexError) as error:
            self._writer = None
            while self._pending:
                future = self._pending.popleft()
                if not future.done():
                    future.set_exception(ConnectionError(f"vendor connection lost: {error}"))

    def send(self, path: str, params: dict[str, str | int]) -> asyncio.Future[int]:
        """Write one call now (if connected); the future gets the answer's status."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        target = path + "?" + urlencode(params)
        request = f"GET {target} HTTP/1.1\r\nhost: vendor\r\n\r\n".encode()
        if self._writer is not None:
            self._pending.append(future)
            self._writer.write(request)
        else:
            task = asyncio.create_task(self._send_after_connecting(request, future))
            self._connects.add(task)
            task.add_done_callback(self._connects.discard)
        return future

    async def _send_after_connecting(self, request: bytes, future: asyncio.Future[int]) -> None:
        try:
            writer = await self.connect()
        except OSError as error:
            future.set_exception(error)
            return
        self._pending.append(future)
        writer.write(request)

    async def call(self, path: str, params: dict[str, str | int]) -> int:
        return await self.send(path, params)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as JSON, atomically (readers never see half a file)."""
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    partial.replace(path)


def stop_on_sigterm() -> list[bool]:
    """A flag that SIGTERM and SIGINT set: ``flag[0]`` is true once asked to stop."""
    flag = [False]

    def handler(_signal: int, _frame: object) -> None:
        flag[0] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return flag


def process_rss_kib(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
