"""The httpx transports against the real server, with mock vendors: quota before each
request, fleet-wide pauses on rate-limit answers, bounded retries, and a vendor that escalates
its wait for every call during a cessation it announced (the transports cause none)."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from _fleet import call_through_transport
from _support import EscalatingVendor, Server, serve_vendor, unique
from tollgate_client import (
    PRIORITY_EXTENSION,
    AsyncClient,
    BadRequest,
    Client,
    RateLimited,
    Verdict,
)
from tollgate_client.httpx import AsyncTollgateTransport, TollgateTransport

MINUTE_MS = 60_000
VENDOR = "api.vendor.test"


class Vendor:
    """A scripted vendor: answers in turn (the last repeats), counting calls."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request)
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok() -> httpx.Response:
    return httpx.Response(200, json={"ok": True})


def rate_limit(client: Client, limit: int = 1000, **fields: Any) -> str:
    name = unique("vendor")
    client.limits.put(name, kind="rate", limit=limit, period_ms=MINUTE_MS, **fields)
    return name


@pytest.fixture
def fast() -> dict[str, Any]:
    """Small waits, so that retries are quick; the server still decides every grant."""
    return {"backoff": 0.01, "backoff_max": 0.05, "resume_jitter_max": 0.05}


def vendor_client(
    client: Client, hosts: dict[str, Any], vendor: Vendor, **options: Any
) -> httpx.Client:
    transport = TollgateTransport(client, hosts, transport=httpx.MockTransport(vendor), **options)
    return httpx.Client(transport=transport)


def test_each_request_takes_a_unit_and_none_is_sent_without_one(client: Client) -> None:
    name = rate_limit(client, limit=2)
    vendor = Vendor(ok())
    with vendor_client(client, {VENDOR: name}, vendor, wait_max=0.2) as http:
        assert http.get(f"https://{VENDOR}/a").status_code == 200
        assert http.post(f"https://{VENDOR}/b", json={"x": 1}).status_code == 200
        with pytest.raises(RateLimited) as caught:
            http.get(f"https://{VENDOR}/c")
    assert len(vendor.calls) == 2, "the third request never left"
    assert name in str(caught.value)
    assert client.try_acquire(name) is None


def test_unmapped_hosts_pass_through_untouched(client: Client) -> None:
    name = rate_limit(client, limit=1)
    vendor = Vendor(ok())
    with vendor_client(client, {VENDOR: name}, vendor) as http:
        for _ in range(3):
            assert http.get("https://elsewhere.test/").status_code == 200
    assert len(vendor.calls) == 3
    assert client.try_acquire(name) is not None, "no unit was taken"


def test_a_429_pauses_the_limit_on_the_server(client: Client, fast: dict[str, Any]) -> None:
    name = rate_limit(client)
    vendor = Vendor(httpx.Response(429, headers={"Retry-After": "20"}))
    with vendor_client(client, {VENDOR: name}, vendor, retries_max=0, **fast) as http:
        response = http.get(f"https://{VENDOR}/")
    assert response.status_code == 429, "with retries spent, the vendor's answer comes back"
    with pytest.raises(RateLimited) as caught:
        client.acquire(name)
    assert caught.value.reason == "paused"
    assert caught.value.retry_after >= 19.0


def test_a_503_with_retry_after_pauses_and_one_without_retries(
    client: Client, fast: dict[str, Any]
) -> None:
    shedding = rate_limit(client)
    vendor = Vendor(httpx.Response(503, headers={"Retry-After": "20"}))
    with vendor_client(client, {VENDOR: shedding}, vendor, retries_max=0, **fast) as http:
        assert http.get(f"https://{VENDOR}/").status_code == 503
    assert client.try_acquire(shedding) is None, "paused"
    failing = rate_limit(client)
    vendor = Vendor(httpx.Response(503), ok())
    with vendor_client(client, {VENDOR: failing}, vendor, **fast) as http:
        assert http.get(f"https://{VENDOR}/").status_code == 200
    assert len(vendor.calls) == 2
    assert client.try_acquire(failing) is not None, "not paused"


def test_retries_are_bounded_and_retry_after_zero_pauses_nothing(
    client: Client, fast: dict[str, Any]
) -> None:
    name = rate_limit(client)
    vendor = Vendor(httpx.Response(429, headers={"Retry-After": "0"}))
    with vendor_client(client, {VENDOR: name}, vendor, retries_max=2, **fast) as http:
        assert http.get(f"https://{VENDOR}/").status_code == 429
    assert len(vendor.calls) == 3, "one attempt and two retries"
    assert client.try_acquire(name) is not None, "no pause was invented"


def test_transient_failures_are_retried_for_idempotent_methods_only(
    client: Client, fast: dict[str, Any]
) -> None:
    name = rate_limit(client)
    vendor = Vendor(httpx.Response(502), ok())
    with vendor_client(client, {VENDOR: name}, vendor, **fast) as http:
        assert http.put(f"https://{VENDOR}/", content=b"x").status_code == 200
    assert len(vendor.calls) == 2
    vendor = Vendor(httpx.Response(502), ok())
    with vendor_client(client, {VENDOR: name}, vendor, **fast) as http:
        assert http.post(f"https://{VENDOR}/", content=b"x").status_code == 502
    assert len(vendor.calls) == 1, "a POST that failed may have been done: not retried"
    vendor = Vendor(httpx.ConnectError("refused"), ok())
    with vendor_client(client, {VENDOR: name}, vendor, **fast) as http:
        assert http.get(f"https://{VENDOR}/").status_code == 200
    assert len(vendor.calls) == 2
    vendor = Vendor(httpx.ConnectError("refused"))
    with (
        vendor_client(client, {VENDOR: name}, vendor, retries_max=1, **fast) as http,
        pytest.raises(httpx.ConnectError),
    ):
        http.get(f"https://{VENDOR}/")
    assert len(vendor.calls) == 2


def test_a_rate_limited_post_is_retried_but_a_streamed_body_is_not(
    client: Client, fast: dict[str, Any]
) -> None:
    name = rate_limit(client)
    vendor = Vendor(httpx.Response(429, headers={"Retry-After": "0"}), ok())
    with vendor_client(client, {VENDOR: name}, vendor, **fast) as http:
        assert http.post(f"https://{VENDOR}/", json={"a": 1}).status_code == 200
    assert [call.content for call in vendor.calls] == [b'{"a":1}', b'{"a":1}']

    def stream() -> Iterator[bytes]:
        yield b"chunk"

    vendor = Vendor(httpx.Response(429, headers={"Retry-After": "20"}), ok())
    with vendor_client(client, {VENDOR: name}, vendor, **fast) as http:
        assert http.post(f"https://{VENDOR}/", content=stream()).status_code == 429
    assert len(vendor.calls) == 1
    assert client.try_acquire(name) is None, "its rate-limit answer still paused the host"


def test_priority_from_the_request_extension(client: Client) -> None:
    name = rate_limit(client, limit=2, reserve={"high": 1})
    vendor = Vendor(ok())
    with vendor_client(client, {VENDOR: name}, vendor, wait_max=0.2, priority="low") as http:
        assert http.get(f"https://{VENDOR}/").status_code == 200
        with pytest.raises(RateLimited):
            http.get(f"https://{VENDOR}/")
        response = http.get(f"https://{VENDOR}/", extensions={PRIORITY_EXTENSION: "high"})
        assert response.status_code == 200
        with pytest.raises(BadRequest) as caught:
            http.get(f"https://{VENDOR}/", extensions={PRIORITY_EXTENSION: "urgent"})
    assert caught.value.field == "priority"
    assert len(vendor.calls) == 2


def test_a_user_rule_runs_before_the_defaults(client: Client, fast: dict[str, Any]) -> None:
    name = rate_limit(client)

    def classify(response: httpx.Response) -> Verdict | None:
        if response.status_code == 400 and "x-quota-exceeded" in response.headers:
            return Verdict.rate_limited(20.0)
        return None

    vendor = Vendor(httpx.Response(400, headers={"x-quota-exceeded": "1"}))
    with vendor_client(
        client, {VENDOR: name}, vendor, retries_max=0, classify=classify, **fast
    ) as http:
        assert http.get(f"https://{VENDOR}/").status_code == 400
    assert client.try_acquire(name) is None, "the rule's verdict paused the host"


def test_a_pause_known_here_outlasting_wait_max_fails_at_once(
    client: Client, fast: dict[str, Any]
) -> None:
    name = rate_limit(client)
    vendor = Vendor(httpx.Response(429, headers={"Retry-After": "30"}), ok())
    with (
        vendor_client(client, {VENDOR: name}, vendor, retries_max=1, wait_max=1.0, **fast) as http,
        pytest.raises(RateLimited) as caught,
    ):
        http.get(f"https://{VENDOR}/")
    assert caught.value.reason == "paused"
    assert caught.value.retry_after > 25.0
    assert len(vendor.calls) == 1, "the retry waits for the pause, and the pause is too long"


def test_the_transport_closes_its_inner_transport(client: Client) -> None:
    closed: list[bool] = []

    class Inner(httpx.MockTransport):
        def close(self) -> None:
            closed.append(True)

    transport = TollgateTransport(client, {VENDOR: "x"}, transport=Inner(Vendor(ok())))
    with httpx.Client(transport=transport):
        pass
    assert closed == [True]


# ---- a vendor that escalates ----------------------------------------------------------------


def escalation_limits(client: Client) -> list[str]:
    """A host's limits: a roomy rate limit (paused on a 429) and one request in flight."""
    rate_name = rate_limit(client, limit=10_000)
    in_flight = unique("flight")
    client.limits.put(in_flight, kind="concurrency", limit=1, lease_ttl_ms=MINUTE_MS)
    return [rate_name, in_flight]


def test_no_escalation_across_processes_and_threads(client: Client, server: Server) -> None:
    """Two processes of four threads each call a vendor that escalates; none is caught in a
    cessation, because the first 429 pauses the host for the whole fleet before the next
    request may leave."""
    limits = escalation_limits(client)
    vendor = EscalatingVendor(announce_at=frozenset({4, 20}), retry_after=1)
    with serve_vendor(vendor) as vendor_url:
        context = multiprocessing.get_context("spawn")
        with context.Pool(2) as pool:
            results = pool.starmap(
                call_through_transport, [(server.url, limits, vendor_url, 4, 4)] * 2
            )
    statuses = [status for process_statuses, _ in results for status in process_statuses]
    errors = [error for _, process_errors in results for error in process_errors]
    assert errors == []
    assert vendor.announced == 2, "the vendor did announce cessations"
    assert vendor.escalations == 0
    assert statuses == [200] * 32, "every request got through after its cessation"


async def test_no_escalation_with_the_async_transport(client: Client, server: Server) -> None:
    limits = escalation_limits(client)
    vendor = EscalatingVendor(announce_at=frozenset({3, 12}), retry_after=1)
    async with AsyncClient(server.url) as tollgate:
        transport = AsyncTollgateTransport(
            tollgate,
            {VENDOR: limits},
            transport=httpx.MockTransport(vendor.mock),
            retries_max=5,
        )
        async with httpx.AsyncClient(transport=transport) as http:

            async def worker() -> list[int]:
                return [(await http.get(f"https://{VENDOR}/")).status_code for _ in range(3)]

            results = await asyncio.gather(*(worker() for _ in range(6)))
    assert vendor.announced == 2
    assert vendor.escalations == 0
    assert [status for statuses in results for status in statuses] == [200] * 18


async def test_async_transport_quota_and_pass_through(client: Client, server: Server) -> None:
    name = rate_limit(client, limit=1)
    vendor = Vendor(ok())
    async with AsyncClient(server.url) as tollgate:
        transport = AsyncTollgateTransport(
            tollgate, {VENDOR: name}, transport=httpx.MockTransport(vendor), wait_max=0.2
        )
        async with httpx.AsyncClient(transport=transport) as http:
            assert (await http.get(f"https://{VENDOR}/")).status_code == 200
            with pytest.raises(RateLimited):
                await http.get(f"https://{VENDOR}/")
            assert (await http.get("https://elsewhere.test/")).status_code == 200
    assert len(vendor.calls) == 2


async def test_async_transport_pauses_and_retries(client: Client, server: Server) -> None:
    name = rate_limit(client)
    vendor = Vendor(
        httpx.Response(502),
        httpx.Response(429, headers={"Retry-After": "20"}),
    )
    async with AsyncClient(server.url) as tollgate:
        transport = AsyncTollgateTransport(
            tollgate,
            {VENDOR: name},
            transport=httpx.MockTransport(vendor),
            retries_max=1,
            backoff=0.01,
            backoff_max=0.01,
        )
        async with httpx.AsyncClient(transport=transport) as http:
            assert (await http.get(f"https://{VENDOR}/")).status_code == 429
    assert len(vendor.calls) == 2
    with pytest.raises(RateLimited) as caught:
        client.acquire(name)
    assert caught.value.reason == "paused"
