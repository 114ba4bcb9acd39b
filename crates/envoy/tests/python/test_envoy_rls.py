"""End-to-end tests of Tollgate's Envoy rate limit service
(`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`), through Envoy's generated stubs,
against the `tollgate` binary in TOLLGATE_BIN.

Matching and counting follow envoyproxy/ratelimit's YAML; Tollgate adds that a request is all or
nothing (an OVER_LIMIT request counts no hit on any descriptor) and refuses an empty domain or an
empty list of descriptors with INVALID_ARGUMENT.

Time: windows are fixed, aligned to the unit from the Unix epoch. Counting tests use hour or day
units and first step out of the last seconds of the current window (`clear_of_boundary`), so no
count depends on a boundary not being crossed; the second-unit test checks safety only."""

from __future__ import annotations

import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from harness import OK, OVER_LIMIT, Server, health_pb2, rls_pb2, run_to_exit

Unit = rls_pb2.RateLimitResponse.RateLimit.Unit
MAX_U32 = 4294967295
HOUR = 3600
DAY = 86400

UNIT_SECONDS = {
    "second": 1,
    "minute": 60,
    "hour": HOUR,
    "day": DAY,
    "week": 7 * DAY,
    "month": 30 * DAY,
    "year": 365 * DAY,
}
UNIT_ENUM = {
    "second": Unit.SECOND,
    "minute": Unit.MINUTE,
    "hour": Unit.HOUR,
    "day": Unit.DAY,
    "week": Unit.WEEK,
    "month": Unit.MONTH,
    "year": Unit.YEAR,
}
# Slack for comparing the server's clock (microseconds) with time.time() (a float).
CLOCK_EPS = 0.005
# Polling a reload: the server reads its files every second; this allows for a slow machine.
RELOAD_DEADLINE = 30.0


# ---- helpers --------------------------------------------------------------------------------


def clear_of_boundary(unit_seconds: int, margin: float = 60.0) -> None:
    """Sleep past the end of the current window when fewer than `margin` seconds are left in
    it, so that the counts that follow all fall in one window."""
    left = unit_seconds - time.time() % unit_seconds
    if left < margin:
        time.sleep(left + 0.1)


def reset_seconds(status: rls_pb2.RateLimitResponse.DescriptorStatus) -> float:
    assert status.HasField("duration_until_reset"), status
    return status.duration_until_reset.seconds + status.duration_until_reset.nanos / 1e9


def window_ends(status, unit: int, before: float, after: float) -> list[int]:
    """The window ends consistent with the status: multiples of `unit` (from the Unix epoch)
    equal to the server's time + duration_until_reset, for a server time in [before, after]."""
    reset = reset_seconds(status)
    assert 0 < reset <= unit + CLOCK_EPS, f"duration_until_reset {reset} not in (0, {unit}]"
    low = math.ceil((before + reset - CLOCK_EPS) / unit)
    high = math.floor((after + reset + CLOCK_EPS) / unit)
    return [k * unit for k in range(low, high + 1)]


def timed_ask(server: Server, domain: str, descriptors, hits: int = 0):
    before = time.time()
    answer = server.ask(domain, descriptors, hits)
    return answer, before, time.time()


def assert_no_limit(status, remaining: int = 0) -> None:
    assert status.code == OK, status
    assert not status.HasField("current_limit"), status
    assert status.limit_remaining == remaining, status


def limit_name(status) -> str | None:
    return status.current_limit.name if status.HasField("current_limit") else None


def wait_until(condition: Callable[[], bool], what: str, deadline: float = RELOAD_DEADLINE):
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"{what}: not within {deadline} s"
        time.sleep(0.1)


# ---- the service is up ----------------------------------------------------------------------


def test_health_is_serving_for_the_server_and_the_rate_limit_service(serve) -> None:
    server = serve("domain: health\n")
    for service in ("", "envoy.service.ratelimit.v3.RateLimitService"):
        answer = server.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as refused:
        server.health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND


def test_bad_requests_are_invalid_argument_and_not_counted_as_decisions(serve) -> None:
    server = serve(
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5}\n"
    )
    with pytest.raises(grpc.RpcError) as empty_domain:
        server.ask("", [[("k", "v")]])
    assert empty_domain.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "domain" in empty_domain.value.details()
    with pytest.raises(grpc.RpcError) as no_descriptors:
        server.ask("api", [])
    assert no_descriptors.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "descriptors" in no_descriptors.value.details()
    assert server.metric("tollgate_envoy_decisions_total", 'code="ok"') == 0
    assert server.metric("tollgate_envoy_decisions_total", 'code="over_limit"') == 0
    # Nothing was counted by the refused requests.
    clear_of_boundary(DAY)
    assert server.ask("api", [[("k", "v")]]).statuses[0].limit_remaining == 4


def test_decisions_are_counted_in_metrics_by_overall_code(serve) -> None:
    server = serve(
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 2}\n"
    )
    clear_of_boundary(DAY)
    codes = [server.ask("api", [[("k", "m")]]).overall_code for _ in range(5)]
    assert codes == [OK, OK, OVER_LIMIT, OVER_LIMIT, OVER_LIMIT]
    server.ask("elsewhere", [[("k", "m")]])
    assert server.metric("tollgate_envoy_decisions_total", 'code="ok"') == 3
    assert server.metric("tollgate_envoy_decisions_total", 'code="over_limit"') == 3


# ---- counting in fixed windows --------------------------------------------------------------


def test_a_key_only_entry_counts_each_value_on_its_own(serve) -> None:
    server = serve(
        """
domain: api
descriptors:
  - key: remote_address
    rate_limit:
      name: per-address
      unit: hour
      requests_per_unit: 3
"""
    )
    clear_of_boundary(HOUR)
    ends = set()
    for expected in (2, 1, 0):
        answer, before, after = timed_ask(server, "api", [[("remote_address", "10.0.0.1")]])
        assert answer.overall_code == OK
        (status,) = answer.statuses
        assert status.code == OK
        assert status.limit_remaining == expected
        assert status.current_limit.name == "per-address"
        assert status.current_limit.requests_per_unit == 3
        assert status.current_limit.unit == Unit.HOUR
        ends.update(window_ends(status, HOUR, before, after))
    over, before, after = timed_ask(server, "api", [[("remote_address", "10.0.0.1")]])
    assert over.overall_code == OVER_LIMIT
    assert over.statuses[0].code == OVER_LIMIT
    assert over.statuses[0].limit_remaining == 0
    assert over.statuses[0].current_limit.requests_per_unit == 3
    ends.update(window_ends(over.statuses[0], HOUR, before, after))
    assert len(ends) == 1, f"one window for all four answers: {ends}"
    # Another value has a counter of its own.
    other = server.ask("api", [[("remote_address", "10.0.0.2")]])
    assert other.overall_code == OK
    assert other.statuses[0].limit_remaining == 2


@pytest.mark.parametrize("unit", list(UNIT_SECONDS))
def test_every_unit_reports_a_window_aligned_to_the_epoch(serve, unit: str) -> None:
    server = serve(
        f"""
domain: units
descriptors:
  - key: u
    rate_limit:
      name: per-{unit}
      unit: {unit}
      requests_per_unit: 1000
"""
    )
    seconds = UNIT_SECONDS[unit]
    for attempt in range(3):
        answer, before, after = timed_ask(server, "units", [[("u", f"{unit}-{attempt}")]])
        assert answer.overall_code == OK
        (status,) = answer.statuses
        assert status.current_limit.unit == UNIT_ENUM[unit]
        assert status.current_limit.requests_per_unit == 1000
        assert status.current_limit.name == f"per-{unit}"
        assert window_ends(status, seconds, before, after), (
            f"{unit}: duration_until_reset {reset_seconds(status)} does not end a window "
            f"aligned to {seconds} s from the epoch (asked between {before} and {after})"
        )


def test_unit_names_are_case_insensitive(serve) -> None:
    server = serve(
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: HOUR, requests_per_unit: 4}\n"
    )
    status = server.ask("api", [[("k", "v")]]).statuses[0]
    assert status.current_limit.unit == Unit.HOUR


def fits_windows(candidates: list[list[int]], limit: int) -> bool:
    """Whether answers, in the order they were asked one after another, can each be placed in one
    of their candidate windows, never in an earlier window than the answer before (the server's
    clock does not run backwards between sequential calls), with no window holding more than
    `limit`. Placing each in the earliest window that has room is optimal: a later choice only
    narrows what the answers after it can take."""
    held: dict[int, int] = defaultdict(int)
    floor = -math.inf
    for ends in candidates:
        place = next((end for end in sorted(ends) if end >= floor and held[end] < limit), None)
        if place is None:
            return False
        held[place] += 1
        floor = place
    return True


def test_fits_windows_refuses_an_overshoot_across_a_boundary() -> None:
    # Two windows ending at 1 and 2; the two middle answers could be in either.
    assert fits_windows([[1], [1], [1, 2], [1, 2], [2], [2]], 3)
    # Seven answers over two windows of 3 fit no placement.
    assert not fits_windows([[1], [1], [1, 2], [1, 2], [1, 2], [2], [2]], 3)
    # An answer after one placed in window 2 cannot go back to window 1.
    assert not fits_windows([[1], [1], [2], [1, 2], [2], [2]], 3)


def test_a_second_window_never_grants_more_than_its_limit(serve) -> None:
    """Safety only: each granted answer is placed in its aligned one-second window by its
    duration_until_reset and the test's own clock around the call; an answer near a boundary,
    which two windows fit, is kept and may go in either. The answers must fit the windows with no
    window holding more than 3 of them (`fits_windows`), and the answers of one window never
    repeat a limit_remaining."""
    server = serve(
        "domain: fast\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n"
    )
    granted: list[tuple[list[int], int]] = []
    windows: set[int] = set()
    saw_over = False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (saw_over and len(windows) >= 3):
        answer, before, after = timed_ask(server, "fast", [[("k", "v")]])
        (status,) = answer.statuses
        assert status.current_limit.unit == Unit.SECOND
        ends = window_ends(status, 1, before, after)
        assert ends, f"duration_until_reset {reset_seconds(status)} fits no window"
        if answer.overall_code == OVER_LIMIT:
            saw_over = True
            assert status.code == OVER_LIMIT and status.limit_remaining == 0
            continue
        assert answer.overall_code == OK and status.code == OK
        assert status.limit_remaining <= 2
        granted.append((ends, status.limit_remaining))
        windows.update(ends)
    assert saw_over, "never refused over 3 a second"
    assert len(windows) >= 3, f"grants seen in too few windows: {sorted(windows)}"
    assert fits_windows([ends for ends, _ in granted], 3), (
        f"more than 3 grants in one window: {granted}"
    )
    by_window: dict[int, list[int]] = defaultdict(list)
    for ends, remaining in granted:
        if len(ends) == 1:
            by_window[ends[0]].append(remaining)
    for end, remaining in by_window.items():
        assert len(set(remaining)) == len(remaining), f"window ending {end}: {remaining}"


def test_hits_addend_takes_that_many_and_zero_means_one(serve) -> None:
    server = serve(
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
    )
    clear_of_boundary(HOUR)
    descriptors = [[("k", "hits")]]
    assert server.ask("api", descriptors, hits=0).statuses[0].limit_remaining == 4
    assert server.ask("api", descriptors, hits=1).statuses[0].limit_remaining == 3
    assert server.ask("api", descriptors, hits=2).statuses[0].limit_remaining == 1
    refused = server.ask("api", descriptors, hits=2)
    assert refused.overall_code == OVER_LIMIT
    assert refused.statuses[0].code == OVER_LIMIT
    # Nothing of the refused request was taken: the last unit is still there.
    last = server.ask("api", descriptors, hits=1)
    assert last.overall_code == OK
    assert last.statuses[0].limit_remaining == 0
    assert server.ask("api", descriptors).overall_code == OVER_LIMIT


# ---- matching -------------------------------------------------------------------------------

NESTED = """
domain: nested
descriptors:
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: {name: any-free, unit: day, requests_per_unit: 1}
      - key: plan
        rate_limit: {name: any-plan, unit: day, requests_per_unit: 5}
  - key: tenant
    value: big
    descriptors:
      - key: plan
        value: enterprise
        rate_limit: {name: big-enterprise, unit: day, requests_per_unit: 100}
  - key: tenant
    value: team-*
    descriptors:
      - key: plan
        rate_limit: {name: team-plan, unit: day, requests_per_unit: 7}
  - key: tenant
    value: team-special-*
    descriptors:
      - key: plan
        rate_limit: {name: never-reached, unit: day, requests_per_unit: 9}
  - key: tenant
    value: team-x
    descriptors:
      - key: plan
        rate_limit: {name: team-x-plan, unit: day, requests_per_unit: 8}
  - key: path
    value: /files/*/raw
    rate_limit: {name: raw-files, unit: day, requests_per_unit: 4}
"""


def test_most_specific_entry_wins_at_each_level(serve) -> None:
    server = serve(NESTED)
    clear_of_boundary(DAY)

    def ask(*entries: tuple[str, str]):
        (status,) = server.ask("nested", [list(entries)]).statuses
        return status

    # Key only at the first level, then value before key only.
    assert limit_name(ask(("tenant", "acme"), ("plan", "free"))) == "any-free"
    assert limit_name(ask(("tenant", "acme"), ("plan", "pro"))) == "any-plan"
    # An exact value beats the wildcards, whatever the order written.
    assert limit_name(ask(("tenant", "team-x"), ("plan", "pro"))) == "team-x-plan"
    # A wildcard beats the key-only entry; the first matching wildcard wins.
    assert limit_name(ask(("tenant", "team-a"), ("plan", "pro"))) == "team-plan"
    assert limit_name(ask(("tenant", "team-special-1"), ("plan", "pro"))) == "team-plan"
    # A '*' in the middle of a value.
    assert limit_name(ask(("path", "/files/report/raw"))) == "raw-files"
    assert_no_limit(ask(("path", "/files/report/cooked")))


def test_a_value_match_never_falls_back_to_the_key_only_children(serve) -> None:
    server = serve(NESTED)
    clear_of_boundary(DAY)
    # tenant=big has its own children: plan=free is not among them, and the key-only tenant
    # entry's plan=free is not consulted.
    (status,) = server.ask("nested", [[("tenant", "big"), ("plan", "free")]]).statuses
    assert_no_limit(status)
    (status,) = server.ask("nested", [[("tenant", "big"), ("plan", "enterprise")]]).statuses
    assert limit_name(status) == "big-enterprise"
    assert status.limit_remaining == 99
    # A wildcard match does not fall back either: team-a has plan (key only) but no plan=free
    # of its own, so plan=free finds team-plan, not any-free.
    (status,) = server.ask("nested", [[("tenant", "team-a"), ("plan", "free")]]).statuses
    assert limit_name(status) == "team-plan"


def test_requests_shallower_or_deeper_than_the_tree_find_no_limit(serve) -> None:
    server = serve(NESTED)
    answer = server.ask(
        "nested",
        [
            [("tenant", "acme")],
            [("tenant", "acme"), ("plan", "pro"), ("region", "eu")],
            [("path", "/files/a/raw"), ("extra", "x")],
            [],
        ],
    )
    assert answer.overall_code == OK
    assert len(answer.statuses) == 4
    for status in answer.statuses:
        assert_no_limit(status)
        assert not status.HasField("duration_until_reset")


def test_unmatched_descriptors_and_unknown_domains_are_ok_without_a_limit(serve) -> None:
    server = serve(NESTED)
    answer = server.ask("nested", [[("nobody", "x")], [("plan", "free")]])
    assert answer.overall_code == OK
    assert len(answer.statuses) == 2
    for status in answer.statuses:
        assert_no_limit(status)
    unknown = server.ask("no-such-domain", [[("tenant", "acme"), ("plan", "free")], [("a", "b")]])
    assert unknown.overall_code == OK
    assert len(unknown.statuses) == 2
    for status in unknown.statuses:
        assert_no_limit(status)


def test_unlimited_is_ok_with_the_largest_remaining_and_counts_nothing(serve) -> None:
    server = serve(
        """
domain: api
descriptors:
  - key: path
    value: /static/*
    rate_limit: {unlimited: true}
  - key: path
    rate_limit: {unit: day, requests_per_unit: 1}
"""
    )
    clear_of_boundary(DAY)
    for _ in range(5):
        answer = server.ask("api", [[("path", "/static/app.js")]])
        assert answer.overall_code == OK
        assert_no_limit(answer.statuses[0], remaining=MAX_U32)
    assert server.ask("api", [[("path", "/api")]]).overall_code == OK
    assert server.ask("api", [[("path", "/api")]]).overall_code == OVER_LIMIT


def test_share_threshold_makes_one_counter_for_every_value_of_a_wildcard(serve) -> None:
    server = serve(
        """
domain: api
descriptors:
  - key: user
    value: team-*
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: user
    value: solo-*
    rate_limit: {unit: day, requests_per_unit: 1}
"""
    )
    clear_of_boundary(DAY)
    shared = [server.ask("api", [[("user", f"team-{v}")]]) for v in "abc"]
    assert [a.overall_code for a in shared] == [OK, OK, OVER_LIMIT]
    assert [a.statuses[0].limit_remaining for a in shared] == [1, 0, 0]
    # Without share_threshold each value the wildcard matches has a counter of its own.
    solo = [server.ask("api", [[("user", v)]]) for v in ("solo-a", "solo-b", "solo-a")]
    assert [a.overall_code for a in solo] == [OK, OK, OVER_LIMIT]


# ---- one status per descriptor, all or nothing ----------------------------------------------

MIXED = """
domain: mixed
descriptors:
  - key: address
    rate_limit: {name: per-address, unit: hour, requests_per_unit: 10}
  - key: login
    rate_limit: {name: login, unit: hour, requests_per_unit: 2}
  - key: static
    rate_limit: {unlimited: true}
  - key: closed
    rate_limit: {name: closed, unit: hour, requests_per_unit: 0}
"""


def test_one_status_per_descriptor_in_request_order(serve) -> None:
    server = serve(MIXED)
    clear_of_boundary(HOUR)
    answer = server.ask(
        "mixed",
        [[("login", "u1")], [("nobody", "x")], [("static", "s")], [("address", "a1")]],
    )
    assert answer.overall_code == OK
    assert len(answer.statuses) == 4
    login, nobody, static, address = answer.statuses
    assert (login.code, login.current_limit.name, login.limit_remaining) == (OK, "login", 1)
    assert_no_limit(nobody)
    assert_no_limit(static, remaining=MAX_U32)
    assert (address.code, address.current_limit.name, address.limit_remaining) == (
        OK, "per-address", 9)
    assert address.current_limit.requests_per_unit == 10


def test_an_over_limit_request_counts_nothing_on_its_other_descriptors(serve) -> None:
    server = serve(MIXED)
    clear_of_boundary(HOUR)
    address = [("address", "a2")]
    login = [("login", "u2")]
    for expected in (9, 8):
        answer = server.ask("mixed", [address, login])
        assert answer.overall_code == OK
        assert answer.statuses[0].limit_remaining == expected
    refused = server.ask("mixed", [address, login, [("nobody", "x")]])
    assert refused.overall_code == OVER_LIMIT
    assert len(refused.statuses) == 3
    sibling, over, nobody = refused.statuses
    assert sibling.code == OK
    assert sibling.limit_remaining == 8, "the sibling descriptor was counted"
    assert over.code == OVER_LIMIT and over.current_limit.name == "login"
    assert over.limit_remaining == 0
    assert_no_limit(nobody)
    # The address alone: still 8 left before this request.
    alone = server.ask("mixed", [address])
    assert alone.overall_code == OK
    assert alone.statuses[0].limit_remaining == 7


def test_a_zero_limit_is_always_over_and_counts_nothing_else(serve) -> None:
    server = serve(MIXED)
    clear_of_boundary(HOUR)
    address = [("address", "a3")]
    for _ in range(3):
        answer = server.ask("mixed", [address, [("closed", "c")]])
        assert answer.overall_code == OVER_LIMIT
        sibling, closed = answer.statuses
        assert closed.code == OVER_LIMIT
        assert closed.limit_remaining == 0
        assert closed.current_limit.requests_per_unit == 0
        assert closed.current_limit.name == "closed"
        assert sibling.code == OK
        assert sibling.limit_remaining == 10, "the sibling descriptor was counted"
    assert server.ask("mixed", [address]).statuses[0].limit_remaining == 9


# ---- replaces and shadow mode ---------------------------------------------------------------

REPLACES = """
domain: rep
descriptors:
  - key: path
    value: /login
    rate_limit:
      name: login
      unit: hour
      requests_per_unit: 2
  - key: plan
    value: enterprise
    rate_limit:
      name: enterprise
      unit: hour
      requests_per_unit: 100
      replaces:
        - name: login
"""


def test_a_limit_named_in_replaces_does_not_apply_beside_it(serve) -> None:
    server = serve(REPLACES)
    clear_of_boundary(HOUR)
    login = [("path", "/login")]
    enterprise = [("plan", "enterprise")]
    for expected in (99, 98, 97, 96):
        answer = server.ask("rep", [login, enterprise])
        assert answer.overall_code == OK
        replaced, replacing = answer.statuses
        assert_no_limit(replaced)
        assert replacing.current_limit.name == "enterprise"
        assert replacing.limit_remaining == expected
    # Alone, login applies, and was not counted while replaced.
    alone = [server.ask("rep", [login]) for _ in range(3)]
    assert [a.overall_code for a in alone] == [OK, OK, OVER_LIMIT]
    assert alone[0].statuses[0].current_limit.name == "login"
    assert alone[0].statuses[0].limit_remaining == 1


def test_an_unlimited_limit_replaces_the_limits_it_names(serve) -> None:
    server = serve(
        """
domain: rep
descriptors:
  - key: login
    rate_limit: {name: login, unit: hour, requests_per_unit: 1}
  - key: static
    rate_limit:
      unlimited: true
      name: static
      replaces:
        - name: login
"""
    )
    clear_of_boundary(HOUR)
    for _ in range(3):
        answer = server.ask("rep", [[("login", "u")], [("static", "s")]])
        assert answer.overall_code == OK
        replaced, unlimited = answer.statuses
        assert_no_limit(replaced)
        assert_no_limit(unlimited, remaining=MAX_U32)


SHADOW = """
domain: shadow
descriptors:
  - key: watched
    shadow_mode: true
    rate_limit: {name: watched, unit: hour, requests_per_unit: 2}
  - key: watched_closed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: tight
    rate_limit: {name: tight, unit: hour, requests_per_unit: 1}
"""


def test_shadow_mode_is_counted_but_never_over_limit(serve) -> None:
    server = serve(SHADOW)
    clear_of_boundary(HOUR)
    answers = [server.ask("shadow", [[("watched", "w1")]]) for _ in range(4)]
    assert [a.overall_code for a in answers] == [OK] * 4
    assert [a.statuses[0].code for a in answers] == [OK] * 4
    assert [a.statuses[0].limit_remaining for a in answers] == [1, 0, 0, 0]
    assert all(a.statuses[0].current_limit.name == "watched" for a in answers)
    closed = server.ask("shadow", [[("watched_closed", "c")]])
    assert closed.overall_code == OK
    assert closed.statuses[0].code == OK


def test_a_refused_request_does_not_count_its_shadow_descriptor(serve) -> None:
    server = serve(SHADOW)
    clear_of_boundary(HOUR)
    watched = [("watched", "w2")]
    tight = [("tight", "t")]
    first = server.ask("shadow", [watched, tight])
    assert first.overall_code == OK
    assert [s.limit_remaining for s in first.statuses] == [1, 0]
    refused = server.ask("shadow", [watched, tight])
    assert refused.overall_code == OVER_LIMIT
    assert refused.statuses[0].code == OK
    assert refused.statuses[0].limit_remaining == 1, "the shadow descriptor was counted"
    assert refused.statuses[1].code == OVER_LIMIT
    assert server.ask("shadow", [watched]).statuses[0].limit_remaining == 0


# ---- configuration refused at start ---------------------------------------------------------

REFUSED = {
    "bad_yaml": ({"limits.yaml": "domain: a\ndescriptors: [key: x\n"}, "limits.yaml", None),
    "duplicate_key_in_a_level": (
        {"limits.yaml": "domain: a\ndescriptors:\n  - key: k\n  - key: k\n"},
        "limits.yaml", None),
    "duplicate_key_value_in_a_nested_level": (
        {"limits.yaml": "domain: a\ndescriptors:\n  - key: t\n    descriptors:\n"
                        "      - {key: p, value: v}\n      - {key: p, value: v}\n"},
        "limits.yaml", None),
    "duplicate_yaml_field": ({"limits.yaml": "domain: a\ndomain: b\n"}, "limits.yaml", None),
    "unknown_field_ratelimit": (
        {"limits.yaml": "domain: a\ndescriptors:\n  - key: k\n"
                        "    ratelimit: {unit: day, requests_per_unit: 1}\n"},
        "limits.yaml", "ratelimit"),
    "unknown_top_level_field": (
        {"limits.yaml": "domain: a\nlimits: []\n"}, "limits.yaml", "limits"),
    "bad_unit": (
        {"limits.yaml": "domain: a\ndescriptors:\n  - key: k\n"
                        "    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"},
        "limits.yaml", "fortnight"),
    "missing_unit": (
        {"limits.yaml": "domain: a\ndescriptors:\n  - key: k\n"
                        "    rate_limit: {requests_per_unit: 1}\n"},
        "limits.yaml", None),
    "empty_domain": ({"limits.yaml": "domain: \"\"\n"}, "limits.yaml", None),
    "no_domain": ({"limits.yaml": "descriptors:\n  - key: k\n"}, "limits.yaml", None),
    "unlimited_with_a_unit": (
        {"limits.yaml": "domain: a\ndescriptors:\n  - key: k\n"
                        "    rate_limit: {unlimited: true, unit: day, requests_per_unit: 1}\n"},
        "limits.yaml", None),
    "replaces_naming_itself": (
        {"limits.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n"
                        "      {name: me, unit: day, requests_per_unit: 1, replaces: [{name: me}]}\n"},
        "limits.yaml", None),
    "share_threshold_without_a_wildcard": (
        {"limits.yaml": "domain: a\ndescriptors:\n  - key: k\n    value: v\n"
                        "    share_threshold: true\n"
                        "    rate_limit: {unit: day, requests_per_unit: 1}\n"},
        "limits.yaml", None),
    "negative_requests_per_unit": (
        {"limits.yaml": "domain: a\ndescriptors:\n  - key: k\n"
                        "    rate_limit: {unit: day, requests_per_unit: -1}\n"},
        "limits.yaml", None),
    "one_domain_in_two_files_of_a_directory": (
        {"a.yaml": "domain: same\n", "b.yml": "domain: same\n"}, None, "same"),
    "one_bad_file_among_good_ones": (
        {"a.yaml": "domain: a\n", "b.yaml": "domain: b\ndescriptors: [key: x\n",
         "c.yml": "domain: c\n"},
        "b.yaml", None),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_bad_configuration_is_refused_at_start_naming_the_file(case: str, tmp_path: Path
                                                                 ) -> None:
    files, named, mentions = REFUSED[case]
    config = tmp_path / "config"
    config.mkdir()
    for name, text in files.items():
        (config / name).write_text(text)
    workdir = tmp_path / "work"
    workdir.mkdir()
    target = config if len(files) > 1 else config / next(iter(files))
    code, out, err = run_to_exit(target, workdir)
    assert code != 0, f"exit code 0 for {case}\nstderr:\n{err}"
    assert "listening" not in out, out
    if named is not None:
        assert str(config / named) in err, f"stderr does not name {config / named}:\n{err}"
    else:
        assert any(str(config / name) in err for name in files), (
            f"stderr names none of {list(files)}:\n{err}")
    if mentions is not None:
        assert mentions in err, f"stderr does not mention {mentions!r}:\n{err}"


def test_a_missing_configuration_path_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "limits.yaml"
    code, out, err = run_to_exit(missing, tmp_path)
    assert code != 0
    assert str(missing) in err, err


def test_a_directory_reads_every_yaml_file_and_ignores_the_others(start, tmp_path: Path) -> None:
    config = tmp_path / "limits"
    config.mkdir()
    (config / "a.yaml").write_text(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n")
    (config / "b.yml").write_text(
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 2}\n")
    (config / "notes.txt").write_text("domain: [ this is not yaml\n")
    (config / "c.yaml.bak").write_text("domain: a\n")
    (config / "d.json").write_text('{"domain": "d", "descriptors": [{"key": "k", '
                                   '"rate_limit": {"unit": "day", "requests_per_unit": 3}}]}')
    server = start(config)
    for domain, limit in (("a", 1), ("b", 2)):
        (status,) = server.ask(domain, [[("k", "v")]]).statuses
        assert status.current_limit.requests_per_unit == limit, domain
    assert_no_limit(server.ask("d", [[("k", "v")]]).statuses[0])


# ---- hot reload -----------------------------------------------------------------------------


def save(path: Path, text: str) -> None:
    """Replace the file at once: write beside it, then rename over it."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def limit_yaml(requests: int, unit: str = "day") -> str:
    return (f"domain: live\ndescriptors:\n  - key: k\n"
            f"    rate_limit: {{name: live, unit: {unit}, requests_per_unit: {requests}}}\n")


def test_an_edited_file_takes_effect_and_a_bad_edit_is_refused(start, write_config) -> None:
    path = write_config(limit_yaml(1))
    server = start(path)
    probes = iter(range(1_000_000))

    def limit_now() -> int | None:
        (status,) = server.ask("live", [[("k", f"probe-{next(probes)}")]]).statuses
        return status.current_limit.requests_per_unit if status.HasField("current_limit") else None

    assert limit_now() == 1
    assert server.metric("tollgate_envoy_config_reloads_total", 'outcome="failed"') == 0
    save(path, limit_yaml(5))
    wait_until(lambda: limit_now() == 5, "the edit to 5 a day taking effect")
    assert server.metric("tollgate_envoy_config_reloads_total", 'outcome="ok"') >= 1
    clear_of_boundary(DAY)
    codes = [server.ask("live", [[("k", "after-edit")]]).overall_code for _ in range(6)]
    assert codes == [OK] * 5 + [OVER_LIMIT]

    failed_before = server.metric("tollgate_envoy_config_reloads_total", 'outcome="failed"')
    save(path, "domain: live\ndescriptors:\n  - key: k\n"
               "    rate_limit: {unit: fortnight, requests_per_unit: 50}\n")
    wait_until(
        lambda: server.metric("tollgate_envoy_config_reloads_total", 'outcome="failed"')
        > failed_before,
        "the bad edit being counted as a failed reload",
    )
    assert limit_now() == 5, "the previous configuration stays in force"
    assert server.ask("live", [[("k", "after-edit")]]).overall_code == OVER_LIMIT
    assert "fortnight" in server.stderr()

    # A good edit after the bad one is taken again.
    save(path, limit_yaml(9))
    wait_until(lambda: limit_now() == 9, "the edit to 9 a day taking effect")


def test_a_file_added_to_or_removed_from_the_directory_is_read(start, tmp_path: Path) -> None:
    config = tmp_path / "limits"
    config.mkdir()
    (config / "a.yaml").write_text(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n")
    server = start(config)

    def b_limit() -> int | None:
        (status,) = server.ask("b", [[("k", "v")]]).statuses
        return status.current_limit.requests_per_unit if status.HasField("current_limit") else None

    assert b_limit() is None
    temporary = config / "b.yaml.tmp"
    temporary.write_text(
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 4}\n")
    os.replace(temporary, config / "b.yaml")
    wait_until(lambda: b_limit() == 4, "the new file's domain taking effect")
    (config / "b.yaml").unlink()
    wait_until(lambda: b_limit() is None, "the removed file's domain going away")
    assert server.ask("a", [[("k", "v")]]).statuses[0].current_limit.requests_per_unit == 1
    assert server.metric("tollgate_envoy_config_reloads_total", 'outcome="failed"') == 0


# ---- concurrency ----------------------------------------------------------------------------


def run_threads(servers: list[Server], domain: str, entries, threads: int, each: int
                ) -> list[int]:
    """`threads` threads of `each` requests, spread over `servers`; the overall codes."""
    codes: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def work(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            mine = []
            for n in range(each):
                server = servers[(index + n) % len(servers)]
                mine.append(server.ask(domain, [entries]).overall_code)
            with lock:
                codes.extend(mine)
        except BaseException as error:  # reported below
            with lock:
                errors.append(error)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert not worker.is_alive(), "a worker did not finish within 120 s"
    assert not errors, errors
    assert len(codes) == threads * each
    return codes


CONCURRENT = """
domain: conc
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 37}
"""


def test_counts_are_exact_under_concurrency(serve) -> None:
    server = serve(CONCURRENT)
    clear_of_boundary(HOUR)
    codes = run_threads([server], "conc", [("k", "one-server")], threads=4, each=25)
    assert codes.count(OK) == 37
    assert codes.count(OVER_LIMIT) == 63


# ---- two servers on one Redis ---------------------------------------------------------------


def test_two_servers_on_one_redis_share_the_counters(redis_url, redis_namespace, start,
                                                     write_config) -> None:
    path = write_config(
        "domain: shared\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
    servers = [start(path, "--store", redis_url, "--redis-namespace", redis_namespace)
               for _ in range(2)]
    clear_of_boundary(HOUR)
    answers = [servers[n % 2].ask("shared", [[("k", "alternate")]]) for n in range(12)]
    assert [a.overall_code for a in answers].count(OK) == 5
    assert [a.overall_code for a in answers] == [OK] * 5 + [OVER_LIMIT] * 7
    assert [a.statuses[0].limit_remaining for a in answers[:5]] == [4, 3, 2, 1, 0]


def test_two_servers_on_one_redis_count_exactly_under_concurrency(
        redis_url, redis_namespace, start, write_config) -> None:
    path = write_config(CONCURRENT)
    servers = [start(path, "--store", redis_url, "--redis-namespace", redis_namespace)
               for _ in range(2)]
    clear_of_boundary(HOUR)
    codes = run_threads(servers, "conc", [("k", "two-servers")], threads=4, each=25)
    assert codes.count(OK) == 37
    assert codes.count(OVER_LIMIT) == 63
