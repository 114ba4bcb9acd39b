"""The transports' rules, without I/O: reading Retry-After, classifying answers, bounding
pauses and backoffs, and refusing configurations out of range."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from tollgate_client import Verdict, default_verdict, parse_retry_after
from tollgate_client._dispatch import RETRY_AFTER_BYTES_MAX, Policy

# Sun, 06 Nov 1994 08:49:37 GMT, the example date of the HTTP specification.
EXAMPLE = datetime(1994, 11, 6, 8, 49, 37, tzinfo=timezone.utc).timestamp()


def test_delta_seconds() -> None:
    assert parse_retry_after("0", EXAMPLE) == 0.0
    assert parse_retry_after("15", EXAMPLE) == 15.0
    assert parse_retry_after(" 15 ", EXAMPLE) == 15.0
    assert parse_retry_after(b"120", EXAMPLE) == 120.0
    # Overflow saturates; retry_after_max caps it later.
    assert parse_retry_after("9" * 40, EXAMPLE) == float(2**63)


@pytest.mark.parametrize(
    "form",
    ["Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"],
)
def test_http_dates_in_all_three_forms(form: str) -> None:
    assert parse_retry_after(form, EXAMPLE - 30) == 30.0


def test_a_past_date_asks_for_no_wait() -> None:
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", EXAMPLE + 5) == 0.0


def test_two_digit_years_are_never_more_than_50_years_ahead() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    in_2030 = parse_retry_after("Tuesday, 01-Jan-30 00:00:00 GMT", now)
    assert in_2030 is not None
    assert 3 * 365 * 86400 < in_2030 < 5 * 365 * 86400
    assert parse_retry_after("Monday, 01-Jan-90 00:00:00 GMT", now) == 0.0, "1990, in the past"


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "   ",
        "-5",
        "1.5",
        "+5",
        "soon",
        "15s",
        "Sun, 32 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 25:49:37 GMT",
        "sun, 06 nov 1994 08:49:37 gmt",
        "٣",  # a digit, but not ASCII
        b"\xff\xfe",
        "1" * (RETRY_AFTER_BYTES_MAX + 1),
    ],
)
def test_garbage_is_none(garbage: str | bytes) -> None:
    assert parse_retry_after(garbage, EXAMPLE) is None


def test_default_verdicts() -> None:
    def verdict(status: int, retry_after: str | None = None) -> Verdict:
        headers = {} if retry_after is None else {"retry-after": retry_after}
        return default_verdict(status, headers, EXAMPLE)

    assert verdict(429, "15") == Verdict.rate_limited(15.0)
    assert verdict(429) == Verdict.rate_limited(None), "no wait is invented"
    assert verdict(429, "garbage") == Verdict.rate_limited(None)
    assert verdict(503, "2") == Verdict.rate_limited(2.0)
    assert verdict(503, "later") == Verdict.rate_limited(None), "Retry-After at all: shedding"
    assert verdict(503) == Verdict.retry()
    for status in (500, 502, 504, 408):
        assert verdict(status) == Verdict.retry()
    for status in (200, 201, 204, 301, 400, 401, 403, 404, 409, 422, 501):
        assert verdict(status, "5") == Verdict.done(), status


def policy(**overrides: Any) -> Policy:
    settings: dict[str, Any] = {
        "priority": "normal",
        "wait_max": 60.0,
        "retries_max": 3,
        "backoff": 0.1,
        "backoff_max": 5.0,
        "retry_after_default": 30.0,
        "retry_after_max": 900.0,
        "resume_jitter_max": 0.25,
        "classify": None,
    }
    settings.update(overrides)
    return Policy({"api.vendor.example": "vendor-x"}, **settings)


def test_pauses_are_at_least_the_vendors_wait_and_capped() -> None:
    rules = policy()
    for _ in range(200):
        pause = rules.pause_for(15.0)
        assert pause is not None
        assert 15.0 <= pause <= 15.25
        default = rules.pause_for(None)
        assert default is not None
        assert 30.0 <= default <= 30.25
        huge = rules.pause_for(float(2**63))
        assert huge is not None
        assert 900.0 <= huge <= 900.25
    assert rules.pause_for(0.0) is None, "Retry-After: 0 asks for no pause"


def test_backoff_doubles_within_bounds() -> None:
    rules = policy()
    for attempt in range(20):
        full = min(0.1 * 2**attempt, 5.0)
        for _ in range(20):
            assert full / 2 <= rules.backoff(attempt) <= full


def test_hosts_match_with_port_first() -> None:
    import httpx

    rules = Policy(
        {"API.vendor.example": "any-port", "api.vendor.example:8443": ["one", "two"]},
        priority="low",
        wait_max=1,
        retries_max=0,
        backoff=0,
        backoff_max=0,
        retry_after_default=1,
        retry_after_max=1,
        resume_jitter_max=0,
        classify=None,
    )
    specific = rules.host_for(httpx.URL("https://api.vendor.example:8443/x"))
    assert specific is not None
    assert specific.names == ("one", "two")
    assert specific.pause_target == "one"
    general = rules.host_for(httpx.URL("https://API.Vendor.Example/x"))
    assert general is not None
    assert general.names == ("any-port",)
    assert rules.host_for(httpx.URL("https://elsewhere.example/")) is None


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"priority": "urgent"}, "priority"),
        ({"wait_max": 0}, "wait_max"),
        ({"retries_max": 101}, "retries_max"),
        ({"retries_max": -1}, "retries_max"),
        ({"backoff": 6.0}, "backoff"),
        ({"retry_after_default": 0}, "retry_after_default"),
        ({"retry_after_default": 1000.0}, "retry_after_default"),
        ({"retry_after_max": 86400.0}, "retry_after_max"),
        ({"resume_jitter_max": -1}, "resume_jitter_max"),
    ],
)
def test_configuration_out_of_range_is_refused_naming_it(
    overrides: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        policy(**overrides)
