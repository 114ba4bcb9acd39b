"""A fleet on one limit: 4 processes of 20 threads each take permits from the real server and
call a mock vendor that counts arrivals; no window of the vendor's ever sees more than the
limit."""

from __future__ import annotations

import multiprocessing

from _fleet import acquire_then_call
from _support import CountingVendor, Server, serve_vendor, unique
from tollgate_client import Client

PROCESSES = 4
THREADS = 20
LIMIT = 20
PERIOD_MS = 500
# Grants and arrivals at the vendor are apart by a delay that varies (scheduling, the
# network); the margin absorbs up to this much spread, which on a small, busy machine is
# generous. The vendor counts in windows of the period alone.
MARGIN_MS = 1_000


def test_four_processes_of_twenty_threads_never_exceed_the_limit(
    client: Client, server: Server
) -> None:
    name = unique("fleet")
    client.limits.put(name, kind="rate", limit=LIMIT, period_ms=PERIOD_MS, margin_ms=MARGIN_MS)
    vendor = CountingVendor()
    with serve_vendor(vendor) as vendor_url:
        context = multiprocessing.get_context("spawn")
        with context.Pool(PROCESSES) as pool:
            errors = pool.starmap(
                acquire_then_call, [(server.url, name, vendor_url, THREADS, 120.0)] * PROCESSES
            )
    assert [error for process_errors in errors for error in process_errors] == []
    calls = PROCESSES * THREADS
    assert len(vendor.arrivals) == calls, "every thread made its call"
    # The demand was four times the limit: the limiter had to hold calls back.
    assert calls >= 4 * LIMIT
    assert vendor.max_in_window(PERIOD_MS / 1000) <= LIMIT
