"""The blocking client against the real server: every method, the permit's context manager,
the decorator, and every error the server can be made to answer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from _support import ADMIN_TOKEN, Server, ServerFactory, unique
from tollgate_client import (
    AsyncClient,
    BadRequest,
    Client,
    Conflict,
    NotFound,
    Permit,
    RateLimited,
    ServerUnreachable,
    StoreUnavailable,
    TollgateError,
    TooManyKeys,
    Unauthorized,
)

MINUTE_MS = 60_000
T = TypeVar("T")


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a loop of its own, leaving the thread's current loop alone (unlike
    asyncio.run, which unsets it under the async tests' feet)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def rate(client: Client, limit: int, period_ms: int = MINUTE_MS, **fields: Any) -> str:
    name = unique("rate")
    client.limits.put(name, kind="rate", limit=limit, period_ms=period_ms, **fields)
    return name


def concurrency(client: Client, limit: int = 1, lease_ttl_ms: int = MINUTE_MS) -> str:
    name = unique("conc")
    client.limits.put(name, kind="concurrency", limit=limit, lease_ttl_ms=lease_ttl_ms)
    return name


# ---- admin API ------------------------------------------------------------------------------


def test_limits_put_get_list_delete(client: Client) -> None:
    name = unique()
    stored = client.limits.put(name, kind="rate", limit=10, period_ms=1000, reserve={"high": 2})
    assert stored == {
        "name": name,
        "kind": "rate",
        "limit": 10,
        "period_ms": 1000,
        "algorithm": "sliding",
        "reserve": {"high": 2},
    }
    assert client.limits.get(name) == stored
    listed = client.limits.list()
    assert stored in listed
    assert isinstance(listed.version, int)
    assert listed.version > 0
    assert listed.rejected == []
    # What get answers can be sent back as it is, with changes on top.
    changed = client.limits.put(name, client.limits.get(name), limit=20)
    assert changed["limit"] == 20
    assert changed["reserve"] == {"high": 2}
    client.limits.delete(name)
    assert all(limit["name"] != name for limit in client.limits.list())
    with pytest.raises(NotFound):
        client.limits.get(name)
    with pytest.raises(NotFound):
        client.limits.delete(name)


def test_limits_put_refuses_an_unknown_field_naming_it(client: Client) -> None:
    with pytest.raises(BadRequest) as caught:
        client.limits.put(unique(), kind="rate", limit=1, period_ms=1000, perriod=5)
    error = caught.value
    assert error.code == "bad_request"
    assert error.field == "perriod"
    assert error.status == 400
    assert "perriod" in error.message


def test_limits_put_names_a_missing_field(client: Client) -> None:
    with pytest.raises(BadRequest) as caught:
        client.limits.put(unique(), kind="rate", limit=1)
    assert caught.value.field == "period_ms"


def test_admin_api_without_or_with_a_wrong_token_is_unauthorized(server: Server) -> None:
    with Client(server.url) as anonymous, pytest.raises(Unauthorized) as caught:
        anonymous.limits.list()
    assert caught.value.code == "unauthorized"
    assert caught.value.field is None
    assert caught.value.status == 401
    with Client(server.url, token="wrong") as wrong, pytest.raises(Unauthorized):
        wrong.limits.get("anything")


def test_the_admin_token_a_local_server_keeps_is_found_for_that_server(
    servers: ServerFactory, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = str(tmp_path)
    kept = servers.start(env={"TOLLGATE_ADMIN_TOKEN": None, "XDG_STATE_HOME": state})
    monkeypatch.setenv("XDG_STATE_HOME", state)
    with Client(kept.url) as tollgate:
        tollgate.limits.put("kept-token", kind="rate", limit=1, period_ms=1000)
        assert tollgate.limits.get("kept-token")["limit"] == 1
    # Another user's state directory holds no token for it.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "elsewhere"))
    with Client(kept.url) as tollgate, pytest.raises(Unauthorized):
        tollgate.limits.list()


# ---- acquire and permits --------------------------------------------------------------------


def test_acquire_grants_a_permit_with_the_limits_state(client: Client) -> None:
    name = rate(client, 5)
    permit = client.acquire(name, cost=2)
    assert isinstance(permit, Permit)
    assert isinstance(permit.id, str)
    assert permit.id
    assert permit.cost == 2
    assert permit.fence is None
    [status] = permit.limits
    assert status.name == name
    assert status.remaining == 3
    assert 0 < status.reset_after <= 60.0
    assert status.fence is None
    assert status.expires_after is None
    committed = permit.commit(1)
    assert (committed.refunded, committed.released) == (1, 0)
    assert permit.settled


def test_acquire_takes_every_limit_or_none(client: Client) -> None:
    roomy = rate(client, 5)
    full = rate(client, 1)
    client.acquire(full)
    with pytest.raises(RateLimited):
        client.acquire([roomy, full])
    # Nothing was taken from the limit that had room.
    assert client.acquire(roomy, cost=5).limits[0].remaining == 0


def test_a_denial_raises_rate_limited_with_retry_after_and_statuses(client: Client) -> None:
    name = rate(client, 1)
    client.acquire(name)
    with pytest.raises(RateLimited) as caught:
        client.acquire(name)
    denial = caught.value
    assert denial.code == "rate_limited"
    assert denial.status == 429
    assert denial.field is None
    assert denial.reason == "capacity"
    assert 0 < denial.retry_after <= 60.0
    assert [status.name for status in denial.limits] == [name]
    assert denial.limits[0].remaining == 0
    assert isinstance(denial, TollgateError)


def test_try_acquire_returns_none_on_a_denial(client: Client) -> None:
    name = rate(client, 1)
    first = client.try_acquire(name)
    assert first is not None
    assert client.try_acquire(name) is None


def test_wait_none_and_zero_do_not_wait_and_a_wait_is_honoured(client: Client) -> None:
    name = rate(client, 1, period_ms=1000)
    before_first = time.monotonic()
    client.acquire(name)
    assert client.try_acquire(name, wait=None) is None
    assert client.try_acquire(name, wait=0) is None
    permit = client.acquire(name, wait=30.0)
    # Safety, not speed: the second grant came no sooner than a period after the first (the
    # server and this process read the same monotonic clock; 10 ms for rounding).
    assert time.monotonic() - before_first >= 0.99
    permit.commit()


def test_key_selects_a_counter_of_a_per_key_limit(client: Client) -> None:
    name = rate(client, 1, per="user")
    client.acquire(name, key="alice")
    client.acquire(name, key="bob")
    assert client.try_acquire(name, key="alice") is None
    with pytest.raises(BadRequest) as caught:
        client.acquire(name)
    assert caught.value.field == "key"


def test_priority_reserve_keeps_units_for_high(client: Client) -> None:
    name = rate(client, 2, reserve={"high": 1})
    client.acquire(name, priority="low")
    assert client.try_acquire(name, priority="normal") is None
    assert client.try_acquire(name, priority="high") is not None


def test_bad_request_names_the_field(client: Client) -> None:
    name = rate(client, 5)
    with pytest.raises(BadRequest) as caught:
        client.acquire(name, priority="urgent")
    assert caught.value.field == "priority"
    with pytest.raises(BadRequest) as caught:
        client.acquire(name, cost=0)
    assert caught.value.field == "cost"
    with pytest.raises(BadRequest) as caught:
        client.acquire("Not A Name")
    assert caught.value.field == "limits[0]"


def test_arguments_the_client_converts_are_checked_before_sending(client: Client) -> None:
    with pytest.raises(ValueError, match="wait"):
        client.acquire("anything", wait=-1)
    with pytest.raises(ValueError, match="limits"):
        client.acquire([])
    with pytest.raises(ValueError, match="seconds"):
        client.pause("anything", -5)


def test_acquire_of_an_unknown_limit_is_not_found(client: Client) -> None:
    with pytest.raises(NotFound) as caught:
        client.acquire(unique("missing"))
    assert caught.value.code == "not_found"
    assert caught.value.status == 404


def test_context_manager_commits_all_of_cost_on_success(client: Client) -> None:
    name = rate(client, 5)
    with client.acquire(name, cost=3) as permit:
        pass
    assert permit.settled
    # All 3 stay used: 2 left.
    assert client.try_acquire(name, cost=3) is None
    assert client.try_acquire(name, cost=2) is not None


def test_context_manager_commits_used_and_refunds_the_rest(client: Client) -> None:
    name = rate(client, 5)
    with client.acquire(name, cost=3) as permit:
        permit.used = 1
    # 1 used, 2 refunded: 4 left.
    assert client.try_acquire(name, cost=4) is not None
    assert client.try_acquire(name) is None


def test_context_manager_on_exception_commits_nothing(client: Client) -> None:
    name = rate(client, 5)
    with pytest.raises(RuntimeError, match="vendor failed"), client.acquire(name, cost=3) as permit:
        permit.used = 0  # an exception overrides it: the call may have happened
        raise RuntimeError("vendor failed")
    # The 3 units stay spent, and the permit was not committed.
    assert client.try_acquire(name, cost=3) is None
    assert client.try_acquire(name, cost=2) is not None
    assert permit.commit(0).refunded == 3, "never committed: it still can be"


def test_context_manager_on_exception_releases_a_lease(client: Client) -> None:
    name = concurrency(client, 1)
    with pytest.raises(KeyError), client.acquire(name) as permit:
        assert permit.fence is not None
        raise KeyError("boom")
    assert client.try_acquire(name) is not None, "the lease was released"


def test_context_manager_on_success_releases_a_lease(client: Client) -> None:
    name = concurrency(client, 1)
    with client.acquire(name) as permit:
        assert client.try_acquire(name) is None, "held inside the block"
        assert permit.limits[0].expires_after is not None
    assert client.try_acquire(name) is not None


def test_leaving_after_an_explicit_commit_does_nothing_more(client: Client) -> None:
    name = rate(client, 5)
    # A second commit would be a Conflict, raised from the block's exit.
    with client.acquire(name, cost=2) as permit:
        permit.commit(0)
    with pytest.raises(ValueError, match="late"), client.acquire(name, cost=2) as permit:
        permit.commit(2)
        raise ValueError("late failure")
    assert client.try_acquire(name, cost=3) is not None, "0 + 2 used: 3 left"


def test_release_ends_a_lease_and_keeps_rate_units(client: Client) -> None:
    units = rate(client, 3)
    slots = concurrency(client, 1)
    with client.acquire([units, slots], cost=1) as permit:
        released = permit.release()
        assert released.released == 1
        assert released.refunded == 0
        assert client.try_acquire(slots) is not None, "the lease is free"
    assert client.try_acquire(units, cost=3) is None, "the released permit's unit stays used"
    assert client.try_acquire(units, cost=2) is not None


def test_renew_extends_a_lease_and_refuses_a_rate_permit(client: Client) -> None:
    slots = concurrency(client, 1, lease_ttl_ms=30_000)
    with client.acquire(slots) as permit:
        assert 0 < permit.renew() <= 30.0
    with pytest.raises(Conflict):
        permit.renew()
    with client.acquire(rate(client, 5)) as rate_permit, pytest.raises(Conflict) as caught:
        rate_permit.renew()
    assert caught.value.code == "conflict"
    assert caught.value.status == 409


def test_committing_twice_is_a_conflict(client: Client) -> None:
    permit = client.acquire(rate(client, 5))
    permit.commit()
    with pytest.raises(Conflict) as caught:
        permit.commit()
    assert caught.value.code == "conflict"


def test_used_above_cost_is_a_bad_request_on_used(client: Client) -> None:
    permit = client.acquire(rate(client, 5), cost=2)
    with pytest.raises(BadRequest) as caught:
        permit.commit(3)
    assert caught.value.field == "used"


def test_a_forged_permit_is_not_found(client: Client) -> None:
    permit = client.acquire(rate(client, 5))
    last = permit.id[-1]
    forged = Permit(client, permit.id[:-1] + ("0" if last != "0" else "1"), [], 1)
    with pytest.raises(NotFound):
        forged.commit()
    with pytest.raises(BadRequest) as caught:
        Permit(client, "not-a-permit", [], 1).commit()
    assert caught.value.field == "permit"


# ---- costs per limit, commits by limit, charges ---------------------------------------------


def model_limits(client: Client, period_ms: int = MINUTE_MS, **fields: Any) -> list[str]:
    """Requests (10), input tokens (1,000) and output tokens (500) per period."""
    return [rate(client, limit, period_ms=period_ms, **fields) for limit in (10, 1_000, 500)]


def test_costs_per_limit_are_one_decision_all_or_none(client: Client) -> None:
    rpm, itpm, otpm = model_limits(client)
    permit = client.acquire([rpm, itpm, otpm], costs={itpm: 600, otpm: 400})
    assert [status.remaining for status in permit.limits] == [9, 400, 100]
    assert (permit.cost, permit.costs) == (1, {itpm: 600, otpm: 400})
    # Room for the request and its input, not its output: nothing is taken.
    with pytest.raises(RateLimited):
        client.acquire([rpm, itpm, otpm], costs={itpm: 100, otpm: 101})
    fits = client.acquire([rpm, itpm, otpm], costs={itpm: 400, otpm: 100})
    assert [status.remaining for status in fits.limits] == [8, 0, 0]


def test_a_commit_by_limit_refunds_each_limits_own(client: Client) -> None:
    rpm, itpm, otpm = model_limits(client)
    permit = client.acquire([rpm, itpm, otpm], costs={itpm: 600, otpm: 400})
    committed = permit.commit({rpm: 1, itpm: 250, otpm: 380})
    assert (committed.refunded, committed.released) == (350 + 20, 0)
    # 250 and 380 stay counted: 750 and 120 left.
    assert client.try_acquire([itpm, otpm], costs={itpm: 751, otpm: 1}) is None
    assert client.try_acquire([itpm, otpm], costs={itpm: 1, otpm: 121}) is None
    assert client.try_acquire([itpm, otpm], costs={itpm: 750, otpm: 120}) is not None


def test_a_permit_with_costs_commits_all_it_holds_and_releases_its_lease(client: Client) -> None:
    rpm, itpm, otpm = model_limits(client)
    lease = concurrency(client)
    with client.acquire([rpm, itpm, otpm, lease], costs={itpm: 600, otpm: 400}) as permit:
        assert permit.fence is not None
    # Each rate limit keeps all it granted (a number would have been above the output's 400),
    # and the lease was released without being named.
    assert client.try_acquire([itpm, otpm], costs={itpm: 401, otpm: 100}) is None
    assert client.try_acquire([itpm, otpm], costs={itpm: 400, otpm: 100}) is not None
    held = client.acquire([rpm, lease], costs={rpm: 2})
    held.release()
    assert client.try_acquire(lease) is not None
    # The release kept both units: 10 - 1 - 2 left.
    assert client.try_acquire(rpm, cost=8) is None
    assert client.try_acquire(rpm, cost=7) is not None


def test_a_charge_past_the_limit_makes_the_next_acquire_wait(client: Client) -> None:
    _, _, otpm = model_limits(client, period_ms=1000, algorithm="fixed")
    permit = client.acquire(otpm, cost=400)
    permit.commit(380)
    # The answer ran 300 past its grant: counted at once, past the limit.
    [view] = client.charge([otpm], cost=300)
    charged_at = time.monotonic()
    assert (view.name, view.charged, view.used) == (otpm, 300, 680)
    assert 0 < view.reset_after <= 1.0
    assert client.try_acquire(otpm, priority="high") is None
    later = client.acquire(otpm, wait=5.0)
    # Safety, not speed: granted no sooner than the counted debt stopped counting (10 ms for
    # rounding).
    assert time.monotonic() - charged_at >= view.reset_after - 0.01
    later.commit()


def test_a_charge_is_held_to_one_capacity_past_the_limit(client: Client) -> None:
    _, itpm, otpm = model_limits(client)
    client.acquire(otpm, cost=400).commit(380)
    views = client.charge([otpm, itpm], costs={otpm: 5000})
    assert [(view.name, view.charged, view.used) for view in views] == [
        (otpm, 1000 - 380, 1000),
        (itpm, 1, 1),
    ]


def test_costs_commits_and_charges_name_bad_input(client: Client) -> None:
    rpm, itpm, otpm = model_limits(client)
    lease = concurrency(client)
    for costs, field in (({itpm: 5}, f"costs.{itpm}"), ({rpm: 0}, f"costs.{rpm}")):
        with pytest.raises(BadRequest) as caught:
            client.acquire([rpm], costs=costs)
        assert caught.value.field == field
    permit = client.acquire([rpm, itpm, otpm], costs={itpm: 600, otpm: 400})
    for used in ({rpm: 1, itpm: 100}, {rpm: 1, itpm: 100, otpm: 50, lease: 1}, {rpm: 2}):
        with pytest.raises(BadRequest) as caught:
            permit.commit(used)
        assert caught.value.field == "used"
    assert not permit.commit({rpm: 1, itpm: 600, otpm: 400}).refunded
    for limits, kwargs, field in (
        ([lease], {}, "limits"),
        ([otpm], {"cost": 0}, "cost"),
        ([otpm], {"costs": {itpm: 5}}, f"costs.{itpm}"),
    ):
        with pytest.raises(BadRequest) as caught:
            client.charge(limits, **kwargs)
        assert caught.value.field == field
    with pytest.raises(NotFound):
        client.charge([unique("missing")])
    with pytest.raises(TypeError, match=r"^costs: "):
        client.acquire([rpm], costs=[(rpm, 1)])  # type: ignore[arg-type]


# ---- pause ----------------------------------------------------------------------------------


def test_pause_stops_grants_and_only_extends(client: Client) -> None:
    name = rate(client, 100)
    assert client.pause(name, 30) >= 29.0
    assert client.pause(name, 1) > 25.0, "a shorter pause does not shorten it"
    with pytest.raises(RateLimited) as caught:
        client.acquire(name)
    assert caught.value.reason == "paused"
    assert caught.value.retry_after > 25.0


def test_pause_of_one_key(client: Client) -> None:
    name = rate(client, 100, per="account")
    client.pause(name, 30, key="a1")
    assert client.try_acquire(name, key="a1") is None
    assert client.try_acquire(name, key="a2") is not None


def test_pause_errors(client: Client) -> None:
    with pytest.raises(NotFound):
        client.pause(unique("missing"), 1)
    with pytest.raises(BadRequest) as caught:
        client.pause(rate(client, 1), 1, key="k")
    assert caught.value.field == "key"
    with pytest.raises(BadRequest) as caught:
        client.pause(rate(client, 1), 0)
    assert caught.value.field == "retry_after_ms"


# ---- check ----------------------------------------------------------------------------------


def test_check_allows_then_denies_without_raising(client: Client) -> None:
    prefix = unique("api")
    name = unique()
    client.limits.put(
        name,
        kind="rate",
        limit=1,
        period_ms=MINUTE_MS,
        per="user",
        match={"method": "GET", "path": f"/{prefix}/entity/#/bundle"},
    )
    first = client.check("u1", "GET", f"/{prefix}/entity/123/bundle")
    assert first.allowed
    assert first.path == f"/{prefix}/entity/#/bundle"
    assert first.matched == [name]
    assert first.permit is None
    assert first.retry_after is None
    second = client.check("u1", "GET", f"/{prefix}/entity/456/bundle")
    assert not second.allowed
    assert second.retry_after is not None
    assert second.retry_after > 0
    assert second.reason == "capacity"
    assert second.matched == [name]
    assert client.check("u2", "GET", f"/{prefix}/entity/1/bundle").allowed
    unmatched = client.check("u1", "GET", f"/{prefix}/other")
    assert unmatched.allowed
    assert unmatched.matched == []


def test_check_hands_back_a_lease_when_a_concurrency_limit_applied(client: Client) -> None:
    prefix = unique("api")
    name = unique()
    client.limits.put(
        name,
        kind="concurrency",
        limit=1,
        lease_ttl_ms=MINUTE_MS,
        per="user",
        match={"method": "*", "path": f"/{prefix}/export"},
    )
    result = client.check("u1", "POST", f"/{prefix}/export")
    assert result.allowed
    assert result.permit is not None
    with result.permit:
        assert not client.check("u1", "POST", f"/{prefix}/export").allowed
    again = client.check("u1", "POST", f"/{prefix}/export")
    assert again.allowed, "the lease was released"
    assert again.permit is not None
    again.permit.commit()


def test_check_errors_name_the_field(client: Client) -> None:
    with pytest.raises(BadRequest) as caught:
        client.check("u1", "G E T", "/x")
    assert caught.value.field == "method"


# ---- decorator ------------------------------------------------------------------------------


def test_limited_plain_function_holds_the_permit_while_it_runs(client: Client) -> None:
    slots = concurrency(client, 1)
    seen: list[bool] = []

    @client.limited(slots, priority="low")
    def work(value: int) -> int:
        seen.append(client.try_acquire(slots) is None)
        return value * 2

    assert work(21) == 42
    assert work.__name__ == "work"
    assert seen == [True]
    assert client.try_acquire(slots) is not None, "released after the call"


def test_limited_raises_rate_limited_before_running(client: Client) -> None:
    name = rate(client, 1)
    calls: list[int] = []

    @client.limited(name)
    def work() -> None:
        calls.append(1)

    work()
    with pytest.raises(RateLimited):
        work()
    assert calls == [1]


def test_limited_plain_function_that_raises_releases_the_lease(client: Client) -> None:
    slots = concurrency(client, 1)

    @client.limited(slots)
    def work() -> None:
        raise OSError("failed")

    with pytest.raises(OSError, match="failed"):
        work()
    assert client.try_acquire(slots) is not None


def test_limited_coroutine_function_on_the_blocking_client(client: Client) -> None:
    slots = concurrency(client, 1)
    units = rate(client, 2)
    seen: list[bool] = []

    @client.limited([slots, units])
    async def work(value: str) -> str:
        seen.append(client.try_acquire(slots) is None)
        await asyncio.sleep(0)
        return value.upper()

    @client.limited(slots)
    async def fail() -> None:
        raise LookupError("nope")

    assert run_coroutine(work("ok")) == "OK"
    assert seen == [True]
    with pytest.raises(LookupError):
        run_coroutine(fail())
    assert run_coroutine(work("again")) == "AGAIN"
    with pytest.raises(RateLimited):
        run_coroutine(work("third"))
    assert seen == [True, True]


# ---- data token, server errors --------------------------------------------------------------


def test_data_and_admin_tokens(servers: ServerFactory) -> None:
    guarded = servers.start(env={"TOLLGATE_DATA_TOKEN": "data-token"})
    with Client(guarded.url, token="data-token", admin_token=ADMIN_TOKEN) as tollgate:
        name = unique()
        tollgate.limits.put(name, kind="rate", limit=5, period_ms=1000)
        with tollgate.acquire(name):
            pass
    with Client(guarded.url, admin_token=ADMIN_TOKEN) as no_data_token:
        with pytest.raises(Unauthorized):
            no_data_token.acquire(name)
        no_data_token.limits.get(name)
    with Client(guarded.url, token="data-token") as no_admin_token, pytest.raises(Unauthorized):
        no_admin_token.limits.get(name)


def test_the_server_and_the_data_token_come_from_the_environment(
    servers: ServerFactory, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the README's quick start meets it: a server that keeps its admin token for this
    # user, a data token set, and a client made with no arguments.
    state = str(tmp_path)
    guarded = servers.start(
        env={
            "TOLLGATE_ADMIN_TOKEN": None,
            "TOLLGATE_DATA_TOKEN": "data-token",
            "XDG_STATE_HOME": state,
        }
    )
    monkeypatch.setenv("XDG_STATE_HOME", state)
    monkeypatch.setenv("TOLLGATE_SERVER", guarded.url + "/")
    monkeypatch.setenv("TOLLGATE_DATA_TOKEN", "data-token")
    with Client() as tollgate:
        assert tollgate.url == guarded.url
        name = unique()
        # The admin call sends the kept admin token, not the data token.
        tollgate.limits.put(name, kind="rate", limit=5, period_ms=1000)
        with tollgate.acquire(name):
            pass
    # A token given wins over the environment's.
    with Client(token="wrong") as given, pytest.raises(Unauthorized):
        given.acquire(name)
    # So does a URL given.
    monkeypatch.setenv("TOLLGATE_SERVER", "http://127.0.0.1:1")
    with Client(guarded.url) as given:
        given.acquire(name).commit()
    monkeypatch.delenv("TOLLGATE_SERVER")
    monkeypatch.delenv("TOLLGATE_DATA_TOKEN")
    with Client() as default:
        assert default.url == "http://127.0.0.1:7070"
    with Client(guarded.url) as no_data_token, pytest.raises(Unauthorized):
        no_data_token.acquire(name)


async def test_the_async_client_reads_the_environment_too(
    servers: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    guarded = servers.start(env={"TOLLGATE_DATA_TOKEN": "data-token"})
    monkeypatch.setenv("TOLLGATE_SERVER", guarded.url)
    monkeypatch.setenv("TOLLGATE_DATA_TOKEN", "data-token")
    async with AsyncClient(admin_token=ADMIN_TOKEN) as tollgate:
        assert tollgate.url == guarded.url
        name = unique()
        await tollgate.limits.put(name, kind="rate", limit=5, period_ms=1000)
        async with tollgate.acquire(name):
            pass

        # The blocking twin behind decorated plain functions has the same settings.
        @tollgate.limited(name)
        def work() -> str:
            return "done"

        assert await asyncio.to_thread(work) == "done"


def test_too_many_keys(servers: ServerFactory) -> None:
    small = servers.start("--keys-tracked-max", "3")
    with Client(small.url, token=ADMIN_TOKEN) as tollgate:
        name = unique()
        tollgate.limits.put(name, kind="rate", limit=5, period_ms=MINUTE_MS, per="user")
        with pytest.raises(TooManyKeys) as caught:
            for index in range(10):
                tollgate.acquire(name, key=f"user-{index}")
        assert caught.value.code == "too_many_keys"
        assert caught.value.status == 503


def test_store_unavailable_when_the_server_stops_under_a_waiting_acquire(
    servers: ServerFactory,
) -> None:
    stopping = servers.start()
    with Client(stopping.url, token=ADMIN_TOKEN) as tollgate:
        name = unique()
        tollgate.limits.put(name, kind="concurrency", limit=1, lease_ttl_ms=MINUTE_MS)
        tollgate.acquire(name)
        outcome: list[BaseException] = []

        def wait_for_room() -> None:
            try:
                tollgate.acquire(name, wait=60)
            except BaseException as error:
                outcome.append(error)

        waiter = threading.Thread(target=wait_for_room)
        waiter.start()
        # Stop once the acquire waits at the server (its gauge shows it).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            metrics = tollgate._http.get("/metrics").text
            if f'tollgate_waiters{{limit="{name}"}} 1' in metrics:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the acquire never waited at the server")
        assert stopping.stop() == 0
        waiter.join(30)
    [error] = outcome
    assert isinstance(error, StoreUnavailable)
    assert error.code == "store_unavailable"
    assert error.status == 503


def test_an_unreachable_server(unused_port: int) -> None:
    with Client(f"http://127.0.0.1:{unused_port}", timeout=5) as tollgate:
        with pytest.raises(ServerUnreachable) as caught:
            tollgate.acquire("anything")
        assert caught.value.code == "unreachable"
        assert caught.value.status is None
        assert caught.value.__cause__ is not None
