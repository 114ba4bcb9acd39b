"""The httpx transports judged by a vendor that keeps its own count: `tollgate-mock-vendor`
(a real binary) admits at most its true limit in any window, counts every arrival on its own
clock, and reports the most that ever arrived within one period. The transports run on their
defaults against the real server: they read the vendor's rate-limit headers, teach the server
(``POST /v1/learn``) and report each call's grant-to-send delay, so that the fleet stays under
the vendor's true limit even when the configured one is wrong or arrivals are jittered.

Safety (never over) is asserted exactly; throughput only with generous room for a slow machine.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from typing import Any

import httpx
import pytest

from _fleet import saturate
from _support import ADMIN_TOKEN, MockVendor, MockVendorFactory, Server, summary, unique
from tollgate_client import AsyncClient, Client, Forbidden, Quota
from tollgate_client.httpx import AsyncTollgateTransport, TollgateTransport

PERIOD_MS = 1_000
VENDOR_LIMIT = 10


def fleet(
    server: Server,
    limits: list[str],
    vendor: MockVendor,
    *,
    processes: int,
    threads: int,
    seconds: float,
    options: dict[str, Any] | None = None,
) -> tuple[dict[int, int], dict[str, Any]]:
    """``processes`` worker processes of ``threads`` threads each saturate the vendor through
    the sync transport for ``seconds``; returns the statuses they saw and the vendor's report."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes) as pool:
        results = pool.starmap(
            saturate,
            [(server.url, limits, vendor.host, threads, seconds, options or {})] * processes,
        )
    errors = [error for _, process_errors in results for error in process_errors]
    assert errors == []
    statuses: dict[int, int] = {}
    for process_statuses, _ in results:
        for status, count in process_statuses.items():
            statuses[status] = statuses.get(status, 0) + count
    return statuses, vendor.report()


def stats_of(server: Server, name: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{server.url}/v1/stats",
        params={"limit": name},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=30,
    )
    answer.raise_for_status()
    (limit,) = [entry for entry in answer.json()["limits"] if entry["name"] == name]
    stats: dict[str, Any] = limit
    return stats


def test_three_processes_on_defaults_never_put_more_than_the_limit_in_any_window(
    client: Client, server: Server, mock_vendors: MockVendorFactory
) -> None:
    """The configured limit is the vendor's true one, with no margin, and the vendor says
    nothing of its limits: the reported grant-to-send delays widen the margin (and any 429
    lowers the limit), so that jittered arrivals never crowd into one of its windows."""
    name = unique("judge")
    client.limits.put(name, kind="rate", limit=VENDOR_LIMIT, period_ms=PERIOD_MS)
    vendor = mock_vendors.start(
        limit=VENDOR_LIMIT, period_ms=PERIOD_MS, window="sliding", headers="none"
    )
    statuses, report = fleet(server, [name], vendor, processes=3, threads=4, seconds=20.0)
    print(f"defaults, 3 processes x 4 threads, 20 s: {statuses} {summary(report)}")
    assert report["most_in_any_window"] <= VENDOR_LIMIT, summary(report)
    assert report["ok"] >= 10, "the fleet did call the vendor"


@pytest.mark.parametrize("family", ["ietf", "openai"])
def test_a_configured_limit_above_the_vendors_is_lowered_by_its_headers(
    client: Client, server: Server, mock_vendors: MockVendorFactory, family: str
) -> None:
    """Configured at 20/s, the vendor takes 10/s and says so: after its first answer the
    fleet keeps to 10/s (at most one 429 in 15 s). Safety is the assertion; the use floor only
    shows the fleet ran (how much of the vendor it uses depends on the machine's load)."""
    name = unique("judge")
    client.limits.put(name, kind="rate", limit=2 * VENDOR_LIMIT, period_ms=PERIOD_MS)
    vendor = mock_vendors.start(
        limit=VENDOR_LIMIT, period_ms=PERIOD_MS, window="sliding", headers=family
    )
    with Client(server.url) as tollgate:
        transport = TollgateTransport(tollgate, {vendor.host: name})
        with httpx.Client(transport=transport) as http:
            assert http.get(f"{vendor.url}/first").status_code == 200
    learned = stats_of(server, name)["learned"]
    assert learned["configured"] == 2 * VENDOR_LIMIT
    assert learned["effective"] == VENDOR_LIMIT
    assert learned["learned"]["kind"] == "advertised"
    assert learned["learned"]["source"] == f"{family} headers from {vendor.host}"

    statuses, report = fleet(server, [name], vendor, processes=1, threads=6, seconds=15.0)
    print(f"{family}, configured 20/s, vendor 10/s, 15 s: {statuses} {summary(report)}")
    assert report["limited"] <= 1, summary(report)
    assert report["used_share"] >= 0.3, summary(report)
    assert stats_of(server, name)["learned"]["effective"] == VENDOR_LIMIT


async def test_the_async_transport_learns_the_same(
    client: Client, server: Server, mock_vendors: MockVendorFactory
) -> None:
    name = unique("judge")
    client.limits.put(name, kind="rate", limit=2 * VENDOR_LIMIT, period_ms=PERIOD_MS)
    vendor = mock_vendors.start(
        limit=VENDOR_LIMIT, period_ms=PERIOD_MS, window="sliding", headers="ietf"
    )
    async with AsyncClient(server.url) as tollgate:
        transport = AsyncTollgateTransport(tollgate, {vendor.host: name})
        async with httpx.AsyncClient(transport=transport) as http:
            assert (await http.get(f"{vendor.url}/first")).status_code == 200
            deadline = time.monotonic() + 8.0

            async def caller() -> None:
                while time.monotonic() < deadline:
                    await http.get(f"{vendor.url}/call")

            await asyncio.gather(*(caller() for _ in range(6)))
    report = vendor.report()
    print(f"async, ietf, configured 20/s, vendor 10/s, 8 s: {summary(report)}")
    assert report["limited"] <= 1, summary(report)
    assert report["most_in_any_window"] <= VENDOR_LIMIT, summary(report)
    assert stats_of(server, name)["learned"]["effective"] == VENDOR_LIMIT


def test_remaining_zero_pauses_the_fleet_before_any_429(
    client: Client, server: Server, mock_vendors: MockVendorFactory
) -> None:
    """Configured at 10 per 500 ms (twice the vendor's 10 per second in fixed windows), with
    headers that give no window (so the quota does not lower the limit): the answer that says
    nothing remains pauses every process until the vendor's window ends."""
    name = unique("judge")
    client.limits.put(name, kind="rate", limit=VENDOR_LIMIT, period_ms=PERIOD_MS // 2)
    vendor = mock_vendors.start(
        limit=VENDOR_LIMIT, period_ms=PERIOD_MS, window="fixed", headers="github"
    )
    statuses, report = fleet(server, [name], vendor, processes=2, threads=3, seconds=6.0)
    print(f"github, fixed windows, remaining 0: {statuses} {summary(report)}")
    assert report["limited"] == 0, summary(report)
    assert report["most_in_fixed_window"] <= VENDOR_LIMIT, summary(report)
    assert report["ok"] > 2 * VENDOR_LIMIT, "the fleet went on after each pause"


def make_token(server: Server, **fields: Any) -> str:
    answer = httpx.post(
        f"{server.url}/v1/tokens",
        json={"name": unique("token"), **fields},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    secret: str = answer.json()["secret"]
    return secret


def test_a_token_that_may_not_pause_cannot_teach_and_no_lesson_goes_below_the_floor(
    client: Client, server: Server, mock_vendors: MockVendorFactory
) -> None:
    name = unique("judge")
    client.limits.put(name, kind="rate", limit=100, period_ms=PERIOD_MS)
    hostile = make_token(server, limits=[name], may_pause=False)
    with Client(server.url, token=hostile) as tollgate:
        with pytest.raises(Forbidden) as caught:
            tollgate.learn(name, source="a hostile caller", quotas=[Quota(1, 1.0)])
        assert caught.value.status == 403
        # Through the transport: the vendor's answer goes back, the lesson teaches nothing.
        vendor = mock_vendors.start(limit=1, period_ms=60_000, window="fixed", headers="ietf")
        transport = TollgateTransport(tollgate, {vendor.host: name})
        with httpx.Client(transport=transport) as http:
            assert http.get(f"{vendor.url}/call").status_code == 200
    learned = stats_of(server, name).get("learned")
    assert learned is None or (learned["effective"] == 100 and learned["learned"] is None)

    # The admin token may teach; a quota of 1 stops at the floor (10 % of 100).
    taught = client.learn(name, source="vendor says 1", quotas=[Quota(1, 1.0)])
    assert taught.effective == 10
    assert taught.learned is not None
    assert taught.learned.limit == 10
    granted = 0
    deadline = time.monotonic() + 0.2
    while client.try_acquire(name) is not None and time.monotonic() < deadline:
        granted += 1
    assert granted <= 10
