"""The asyncio client against the real server: every method, the permit's async context
manager, the decorator on coroutine and plain functions, and the errors."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from _support import ADMIN_TOKEN, Server, ServerFactory, unique
from tollgate_client import (
    AsyncClient,
    AsyncPermit,
    BadRequest,
    Conflict,
    NotFound,
    RateLimited,
    ServerUnreachable,
    TooManyKeys,
    Unauthorized,
)

MINUTE_MS = 60_000


async def rate(client: AsyncClient, limit: int, period_ms: int = MINUTE_MS, **fields: Any) -> str:
    name = unique("rate")
    await client.limits.put(name, kind="rate", limit=limit, period_ms=period_ms, **fields)
    return name


async def concurrency(client: AsyncClient, limit: int = 1) -> str:
    name = unique("conc")
    await client.limits.put(name, kind="concurrency", limit=limit, lease_ttl_ms=MINUTE_MS)
    return name


async def test_limits_put_get_list_delete(async_client: AsyncClient) -> None:
    name = unique()
    stored = await async_client.limits.put(name, {"kind": "rate", "limit": 3}, period_ms=500)
    assert stored["limit"] == 3
    assert stored["period_ms"] == 500
    assert await async_client.limits.get(name) == stored
    listed = await async_client.limits.list()
    assert stored in listed
    assert listed.version > 0
    await async_client.limits.delete(name)
    with pytest.raises(NotFound):
        await async_client.limits.get(name)
    with pytest.raises(BadRequest) as caught:
        await async_client.limits.put(name, kind="rate", limit=1, period_ms=1, bogus=True)
    assert caught.value.field == "bogus"


async def test_admin_without_token_is_unauthorized(server: Server) -> None:
    async with AsyncClient(server.url) as anonymous:
        with pytest.raises(Unauthorized) as caught:
            await anonymous.limits.list()
    assert caught.value.field is None


async def test_await_acquire_and_commit(async_client: AsyncClient) -> None:
    name = await rate(async_client, 5)
    permit = await async_client.acquire(name, cost=2)
    assert isinstance(permit, AsyncPermit)
    assert permit.limits[0].remaining == 3
    committed = await permit.commit(0)
    assert committed.refunded == 2
    with pytest.raises(Conflict):
        await permit.commit(0)


async def test_async_with_commits_all_of_cost_on_success(async_client: AsyncClient) -> None:
    name = await rate(async_client, 5)
    async with async_client.acquire(name, cost=3) as permit:
        assert not permit.settled
    assert permit.settled
    assert await async_client.try_acquire(name, cost=3) is None
    assert await async_client.try_acquire(name, cost=2) is not None


async def test_costs_per_limit_a_commit_by_limit_and_a_charge(async_client: AsyncClient) -> None:
    rpm, itpm, otpm = [await rate(async_client, limit) for limit in (10, 1_000, 500)]
    permit = await async_client.acquire([rpm, itpm, otpm], costs={itpm: 600, otpm: 400})
    assert [status.remaining for status in permit.limits] == [9, 400, 100]
    assert await async_client.try_acquire([rpm, otpm], costs={otpm: 101}) is None
    committed = await permit.commit({rpm: 1, itpm: 250, otpm: 380})
    assert committed.refunded == 370
    [view] = await async_client.charge([otpm], costs={otpm: 300})
    assert (view.name, view.charged, view.used) == (otpm, 300, 680)
    assert await async_client.try_acquire(otpm, priority="high") is None
    async with async_client.acquire([rpm, itpm], costs={itpm: 700}):
        pass
    # All it held stays counted: 50 input tokens left.
    assert await async_client.try_acquire(itpm, cost=51) is None
    with pytest.raises(BadRequest) as caught:
        await async_client.charge([otpm], costs={rpm: 1})
    assert caught.value.field == f"costs.{rpm}"


async def test_async_with_commits_used(async_client: AsyncClient) -> None:
    name = await rate(async_client, 5)
    async with async_client.acquire(name, cost=3) as permit:
        permit.used = 1
    assert await async_client.try_acquire(name, cost=4) is not None


async def test_async_with_on_exception_commits_nothing_and_releases_leases(
    async_client: AsyncClient,
) -> None:
    units = await rate(async_client, 1)
    slots = await concurrency(async_client, 1)
    with pytest.raises(RuntimeError):
        async with async_client.acquire([units, slots]) as permit:
            assert permit.fence is not None
            raise RuntimeError("vendor failed")
    assert await async_client.try_acquire(slots) is not None, "the lease was released"
    assert await async_client.try_acquire(units) is None, "the rate unit stays spent"


async def test_explicit_commit_or_release_then_leaving_does_nothing_more(
    async_client: AsyncClient,
) -> None:
    name = await rate(async_client, 5)
    async with async_client.acquire(name, cost=2) as permit:
        await permit.commit(0)
    slots = await concurrency(async_client, 1)
    async with async_client.acquire(slots) as lease:
        released = await lease.release()
        assert released.released == 1
    assert await async_client.try_acquire(name, cost=5) is not None


async def test_renew(async_client: AsyncClient) -> None:
    slots = await concurrency(async_client, 1)
    async with async_client.acquire(slots) as lease:
        assert 0 < await lease.renew() <= 60.0
    with pytest.raises(Conflict):
        await lease.renew()


async def test_denials(async_client: AsyncClient) -> None:
    name = await rate(async_client, 1)
    await async_client.acquire(name)
    assert await async_client.try_acquire(name) is None
    with pytest.raises(RateLimited) as caught:
        async with async_client.acquire(name):
            pytest.fail("not granted: the block never runs")
    assert caught.value.reason == "capacity"
    assert caught.value.retry_after > 0
    with pytest.raises(NotFound):
        await async_client.acquire(unique("missing"))
    with pytest.raises(BadRequest) as bad:
        await async_client.acquire(name, priority="urgent")
    assert bad.value.field == "priority"


async def test_a_wait_is_honoured(async_client: AsyncClient) -> None:
    name = await rate(async_client, 1, period_ms=1000)
    before_first = time.monotonic()
    await async_client.acquire(name)
    async with async_client.acquire(name, wait=30):
        # No sooner than a period after the first grant (10 ms for rounding).
        assert time.monotonic() - before_first >= 0.99


async def test_pause(async_client: AsyncClient) -> None:
    name = await rate(async_client, 10)
    assert await async_client.pause(name, 20) >= 19.0
    with pytest.raises(RateLimited) as caught:
        await async_client.acquire(name)
    assert caught.value.reason == "paused"
    with pytest.raises(NotFound):
        await async_client.pause(unique("missing"), 1)


async def test_check(async_client: AsyncClient) -> None:
    prefix = unique("api")
    await async_client.limits.put(
        unique(),
        kind="concurrency",
        limit=1,
        lease_ttl_ms=MINUTE_MS,
        per="user",
        match={"method": "GET", "path": f"/{prefix}/#"},
    )
    allowed = await async_client.check("u1", "GET", f"/{prefix}/42")
    assert allowed.allowed
    assert allowed.path == f"/{prefix}/#"
    assert allowed.permit is not None
    async with allowed.permit:
        denied = await async_client.check("u1", "GET", f"/{prefix}/43")
        assert not denied.allowed
        assert denied.permit is None
        assert denied.retry_after is not None
    again = await async_client.check("u1", "GET", f"/{prefix}/44")
    assert again.allowed
    assert again.permit is not None
    await again.permit.release()


async def test_limited_coroutine_function(async_client: AsyncClient) -> None:
    slots = await concurrency(async_client, 1)
    seen: list[bool] = []

    @async_client.limited(slots, priority="high")
    async def work(value: int) -> int:
        seen.append(await async_client.try_acquire(slots) is None)
        return value + 1

    @async_client.limited(slots)
    async def fail() -> None:
        raise ValueError("boom")

    assert await work(1) == 2
    with pytest.raises(ValueError, match="boom"):
        await fail()
    assert await work(2) == 3
    assert seen == [True, True]
    held = await async_client.acquire(slots)
    with pytest.raises(RateLimited):
        await work(3)
    assert seen == [True, True], "a denied call does not run"
    await held.release()


async def test_limited_plain_function_on_the_async_client(async_client: AsyncClient) -> None:
    slots = await concurrency(async_client, 1)
    units = await rate(async_client, 1)
    seen: list[bool] = []

    @async_client.limited([slots, units])
    def work() -> str:
        # Blocking code, as a plain function is; the permit is held meanwhile.
        with pytest.raises(RateLimited):
            asyncio.run(_acquire_once(async_client.url, slots))
        seen.append(True)
        return "done"

    assert await asyncio.to_thread(work) == "done"
    assert seen == [True]
    with pytest.raises(RateLimited):
        await asyncio.to_thread(work)
    assert await async_client.try_acquire(slots) is not None, "the lease was released"


async def _acquire_once(url: str, name: str) -> None:
    async with AsyncClient(url) as other:
        await other.acquire(name)


async def test_too_many_keys(servers: ServerFactory) -> None:
    small = await asyncio.to_thread(servers.start, "--keys-tracked-max", "2")
    async with AsyncClient(small.url, token=ADMIN_TOKEN) as tollgate:
        name = unique()
        await tollgate.limits.put(name, kind="rate", limit=5, period_ms=MINUTE_MS, per="user")
        with pytest.raises(TooManyKeys):
            for index in range(10):
                await tollgate.acquire(name, key=f"user-{index}")


async def test_an_unreachable_server(unused_port: int) -> None:
    async with AsyncClient(f"http://127.0.0.1:{unused_port}", timeout=5) as tollgate:
        with pytest.raises(ServerUnreachable):
            await tollgate.pause("anything", 1)
