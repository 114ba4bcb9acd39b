"""The transports' rules, without I/O: reading Retry-After, classifying answers, bounding
pauses and backoffs, and refusing configurations out of range."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tollgate_client import Verdict, default_verdict, parse_retry_after
from tollgate_client._dispatch import Policy

# The cases every implementation shares (tollgate-dispatch, this client, the TypeScript one).
VECTORS = json.loads(
    (
        Path(__file__).resolve().parents[3]
        / "crates"
        / "dispatch"
        / "tests"
        / "vectors"
        / "retry_after.json"
    ).read_text()
)
NOW = float(VECTORS["now"])


def _header_value(case: dict[str, Any]) -> str | bytes:
    return bytes.fromhex(case["hex"]) if "hex" in case else str(case["value"])


@pytest.mark.parametrize("case", VECTORS["retry_after"], ids=lambda case: repr(case))
def test_retry_after_vectors(case: dict[str, Any]) -> None:
    read = parse_retry_after(_header_value(case), NOW)
    if case.get("saturates"):
        assert read is not None
        assert read >= 2.0**53
    else:
        assert read == case["seconds"]


@pytest.mark.parametrize("case", VECTORS["verdicts"], ids=lambda case: repr(case))
def test_default_verdict_vectors(case: dict[str, Any]) -> None:
    headers = {"retry-after": case["retry_after"]} if "retry_after" in case else {}
    expected = {
        "done": Verdict.done(),
        "retry": Verdict.retry(),
        "rate_limited": Verdict.rate_limited(case.get("seconds")),
    }[case["verdict"]]
    assert default_verdict(case["status"], headers, NOW) == expected


def test_bytes_are_read_as_ascii_text() -> None:
    assert parse_retry_after(b"120", NOW) == 120.0


def test_two_digit_years_are_never_more_than_50_years_ahead() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    in_2030 = parse_retry_after("Tuesday, 01-Jan-30 00:00:00 GMT", now)
    assert in_2030 is not None
    assert 3 * 365 * 86400 < in_2030 < 5 * 365 * 86400
    assert parse_retry_after("Monday, 01-Jan-90 00:00:00 GMT", now) == 0.0, "1990, in the past"


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
