"""A fleet on one limit: 4 processes of 20 threads each take permits from the real server and
call the judging mock vendor (`tollgate-mock-vendor`), which records when each call arrives on
its own clock; judged from that record, no window of the limiter's span (period plus margin,
less the spread the margin is there for) ever sees more than the limit."""

from __future__ import annotations

import multiprocessing

from _fleet import acquire_then_call
from _support import MockVendorFactory, Server, summary, unique
from tollgate_client import Client

PROCESSES = 4
THREADS = 20
LIMIT = 20
PERIOD_MS = 500
# Grants and arrivals at the vendor are apart by a delay that varies (scheduling, the
# network); the margin absorbs that spread, so the limiter counts in spans of
# PERIOD_MS + MARGIN_MS.
MARGIN_MS = 1_000
# The spread of grant-to-arrival delays the judgement allows (generous on a small, busy
# machine): calls that arrive within a window of the span less this spread were granted
# within one span. A limiter that overshot 1.5x (30 per 1.5 s, one every 50 ms at the most
# even) puts 22 calls in some window of 1.1 s, so this judgement fails it; one that keeps the
# limit passes as long as the spread of delays stays under 0.4 s.
SPREAD_MS = 400
JUDGED_WINDOW_MS = PERIOD_MS + MARGIN_MS - SPREAD_MS


def test_four_processes_of_twenty_threads_never_exceed_the_limit(
    client: Client, server: Server, mock_vendors: MockVendorFactory
) -> None:
    name = unique("fleet")
    client.limits.put(name, kind="rate", limit=LIMIT, period_ms=PERIOD_MS, margin_ms=MARGIN_MS)
    # The vendor's window is the judged one: a call over the limit there is a 429, which
    # the worker reports as an error.
    vendor = mock_vendors.start(
        limit=LIMIT, period_ms=JUDGED_WINDOW_MS, window="sliding", headers="none"
    )
    context = multiprocessing.get_context("spawn")
    with context.Pool(PROCESSES) as pool:
        errors = pool.starmap(
            acquire_then_call,
            [(server.url, name, f"{vendor.url}/call", THREADS, 120.0)] * PROCESSES,
        )
    report = vendor.report()
    assert [error for process_errors in errors for error in process_errors] == []
    # Counted by the vendor: every thread made its one call (four times the limit in all, so
    # the limiter had to hold most of them back).
    assert report["calls"] == PROCESSES * THREADS, summary(report)
    assert report["most_in_any_window"] <= LIMIT, (
        f"calls reached the vendor within {JUDGED_WINDOW_MS} ms beyond the limit of {LIMIT} "
        f"per {PERIOD_MS} ms + {MARGIN_MS} ms margin: {summary(report)}"
    )
