"""Worker processes of the fleet tests. A module of its own so that processes started with
``spawn`` can import the targets."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, Callable

import httpx

from tollgate_client import Client
from tollgate_client.httpx import TollgateTransport


def _run_threads(count: int, body: Callable[[], None]) -> list[str]:
    errors: list[str] = []

    def run() -> None:
        try:
            body()
        except Exception as error:  # reported to the test, which fails on any
            errors.append(f"{type(error).__name__}: {error}")

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def acquire_then_call(
    tollgate_url: str, limit: str, vendor_url: str, threads: int, wait: float
) -> list[str]:
    """Each thread takes a permit on ``limit`` (waiting up to ``wait`` s), then calls the vendor
    once while holding it. Returns the errors."""
    with Client(tollgate_url) as tollgate, httpx.Client(timeout=30.0) as vendor:

        def body() -> None:
            with tollgate.acquire(limit, wait=wait):
                vendor.get(vendor_url).raise_for_status()

        return _run_threads(threads, body)


def call_through_transport(
    tollgate_url: str,
    limits: list[str],
    vendor_url: str,
    threads: int,
    calls: int,
) -> tuple[list[int], list[str]]:
    """Each thread makes ``calls`` requests to the vendor through a TollgateTransport.
    Returns the final statuses and the errors."""
    statuses: list[int] = []
    host = httpx.URL(vendor_url)
    with Client(tollgate_url) as tollgate:
        transport = TollgateTransport(
            tollgate, {f"{host.host}:{host.port}": limits}, wait_max=60.0, retries_max=5
        )
        with httpx.Client(transport=transport, timeout=30.0) as vendor:

            def body() -> None:
                for _ in range(calls):
                    statuses.append(vendor.get(vendor_url).status_code)

            errors = _run_threads(threads, body)
    return statuses, errors


def saturate(
    tollgate_url: str,
    limits: list[str],
    vendor_host: str,
    threads: int,
    seconds: float,
    options: dict[str, Any],
) -> tuple[dict[int, int], list[str]]:
    """Each thread calls the vendor through a TollgateTransport (``options`` its keywords,
    else the defaults) back to back for ``seconds``. Returns the count of each final status
    and the errors."""
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    with Client(tollgate_url) as tollgate:
        transport = TollgateTransport(tollgate, {vendor_host: limits}, **options)
        with httpx.Client(transport=transport, timeout=30.0) as vendor:

            def body() -> None:
                while time.monotonic() < deadline:
                    status = vendor.get(f"http://{vendor_host}/call").status_code
                    with lock:
                        statuses[status] += 1

            errors = _run_threads(threads, body)
    return dict(statuses), errors
