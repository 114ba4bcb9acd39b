"""Values the server answers with, in Python units (seconds as floats), and the request
bodies the clients send. Shared by the sync and async clients, free of I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Union

__all__ = [
    "Charged",
    "CheckResult",
    "Committed",
    "Costs",
    "LearnResult",
    "Learned",
    "LimitList",
    "LimitStatus",
    "Limits",
    "Quota",
    "Used",
    "acquire_body",
    "all_units",
    "charge_body",
    "commit_body",
    "learn_body",
    "learn_result",
    "parse_charged",
    "parse_limits",
    "pause_body",
]

#: One limit name, or several taken together (all or none).
Limits = Union[str, Sequence[str]]

#: Units by limit name: what an acquire takes of limits whose cost differs from ``cost`` (a
#: model call's input and output tokens beside its one request), or what a charge counts.
Costs = Mapping[str, int]

#: What a commit says was used: one number for every rate limit of the permit, or each rate
#: limit's own by name (every rate limit of the permit, nothing else).
Used = Union[int, Mapping[str, int]]

PRIORITIES = ("high", "normal", "low")


@dataclass(frozen=True)
class LimitStatus:
    """One limit's state after a decision.

    ``remaining`` is the units still open to the request's priority; ``reset_after`` the
    seconds until everything counted now stops counting. Leases also carry ``fence`` (a
    number that only grows with each grant) and ``expires_after`` (seconds until the lease
    expires unless renewed).
    """

    name: str
    remaining: int
    reset_after: float
    fence: int | None = None
    expires_after: float | None = None


@dataclass(frozen=True)
class Charged:
    """One limit after a charge (:meth:`Client.charge`).

    ``charged`` is the units counted: the charge, less what would have put the limit more than
    one capacity past itself. ``used`` is the units counted now, the charge among them (past
    the limit, later grants wait until it drains); ``reset_after`` the seconds until everything
    counted now stops counting.
    """

    name: str
    charged: int
    used: int
    reset_after: float


@dataclass(frozen=True)
class Committed:
    """What a commit gave back: rate units refunded and leases released."""

    refunded: int
    released: int


PermitT = TypeVar("PermitT")


@dataclass(frozen=True)
class CheckResult(Generic[PermitT]):
    """The answer to "may this inbound request proceed?".

    ``allowed`` is the decision. ``path`` is the normalized path that was matched and
    ``matched`` the names of the limits that applied. When denied, ``retry_after`` says when to
    try again (seconds) and ``reason`` why; when allowed and a concurrency limit applied,
    ``permit`` holds the lease to commit once the request is done (else ``None``).
    """

    allowed: bool
    path: str
    matched: list[str]
    limits: list[LimitStatus]
    retry_after: float | None = None
    reason: str | None = None
    permit: PermitT | None = None


class LimitList(list[dict[str, Any]]):
    """The limits in force, as a list of dicts (each as ``limits.get`` returns it).

    Also carries ``version`` (grows with every change of the rules in force) and
    ``rejected``: the rows of the rules table that failed validation, each a dict with
    ``name``, ``column``, ``reason`` and ``previous_in_force``.
    """

    def __init__(
        self,
        limits: Sequence[dict[str, Any]] = (),
        *,
        version: int = 0,
        rejected: Sequence[dict[str, Any]] = (),
    ) -> None:
        super().__init__(limits)
        self.version: int = version
        self.rejected: list[dict[str, Any]] = list(rejected)


def _seconds(value: Any) -> float:
    return value / 1000.0 if isinstance(value, (int, float)) else 0.0


def _optional_seconds(value: Any) -> float | None:
    return value / 1000.0 if isinstance(value, (int, float)) else None


def parse_limits(raw: Any) -> list[LimitStatus]:
    """The ``limits`` array of an answer (``reset_ms`` and ``expires_ms`` become seconds)."""
    if not isinstance(raw, list):
        return []
    statuses = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        fence = item.get("fence")
        statuses.append(
            LimitStatus(
                name=str(item.get("name", "")),
                remaining=int(item.get("remaining", 0)),
                reset_after=_seconds(item.get("reset_ms")),
                fence=fence if isinstance(fence, int) else None,
                expires_after=_optional_seconds(item.get("expires_ms")),
            )
        )
    return statuses


def parse_charged(raw: Any) -> list[Charged]:
    """The ``limits`` array of a charge's answer (``reset_ms`` becomes seconds)."""
    if not isinstance(raw, list):
        return []
    return [
        Charged(
            name=str(item.get("name", "")),
            charged=int(item.get("charged", 0)),
            used=int(item.get("used", 0)),
            reset_after=_seconds(item.get("reset_ms")),
        )
        for item in raw
        if isinstance(item, dict)
    ]


def costs_wire(costs: Costs, what: str) -> dict[str, Any]:
    """Units by limit name as sent: names must be strings; the units are the server's to judge
    (its ``bad_request`` names ``costs.<name>``)."""
    if not isinstance(costs, Mapping):
        raise TypeError(f"{what}: units by limit name (a mapping), got {costs!r}")
    for name in costs:
        if not isinstance(name, str):
            raise TypeError(f"{what}: limit names are strings, got {name!r}")
    return dict(costs)


def all_units(limits: Sequence[LimitStatus], cost: int, costs: Costs) -> Used:
    """All a permit was granted, as its commit says it: ``cost``, or with per-limit costs each
    rate limit's own (a lease carries a fence and is released whether named or not)."""
    if not costs:
        return cost
    return {status.name: costs.get(status.name, cost) for status in limits if status.fence is None}


def limit_names(limits: Limits) -> list[str]:
    """``"a"`` or ``["a", "b"]`` as a list of names."""
    if isinstance(limits, str):
        return [limits]
    names = list(limits)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"limit names are strings, got {name!r}")
    if not names:
        raise ValueError("limits: name at least one limit")
    return names


def milliseconds(seconds: float, what: str) -> int:
    """Seconds as whole milliseconds, rounded up: a wait or a pause is never shortened."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what}: seconds as a number, got {seconds!r}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{what}: must be at least 0 seconds, got {seconds!r}")
    if math.isinf(seconds):
        raise ValueError(f"{what}: must be finite")
    return math.ceil(seconds * 1000)


@dataclass(frozen=True)
class AcquireArgs:
    """The body of an acquire, and how long it may wait at the server (seconds)."""

    body: dict[str, Any]
    wait: float


def acquire_body(
    limits: Limits,
    *,
    key: str | None,
    cost: int,
    priority: str,
    wait: float | None,
    costs: Costs | None = None,
) -> AcquireArgs:
    """The body of ``POST /v1/acquire``. ``wait`` is in seconds; ``None`` and 0 do not wait.

    Values only the server can judge (an unknown priority, a zero cost, a name in ``costs``
    that is not among ``limits``) are sent as given, so that the server's ``bad_request``
    names the field.
    """
    names = limit_names(limits)
    wait_ms = 0 if wait is None else milliseconds(wait, "wait")
    body: dict[str, Any] = {"limits": names, "cost": cost, "priority": priority, "wait_ms": wait_ms}
    if key is not None:
        body["key"] = key
    if costs is not None:
        body["costs"] = costs_wire(costs, "costs")
    return AcquireArgs(body=body, wait=wait_ms / 1000.0)


def charge_body(
    limits: Limits, *, cost: int | None, costs: Costs | None, key: str | None
) -> dict[str, Any]:
    """The body of ``POST /v1/charge``; the units are the server's to judge."""
    body: dict[str, Any] = {"limits": limit_names(limits)}
    if cost is not None:
        body["cost"] = cost
    if costs is not None:
        body["costs"] = costs_wire(costs, "costs")
    if key is not None:
        body["key"] = key
    return body


def pause_body(limit: str, seconds: float, key: str | None) -> dict[str, Any]:
    """The body of ``POST /v1/pause``."""
    body: dict[str, Any] = {"limit": limit, "retry_after_ms": milliseconds(seconds, "seconds")}
    if key is not None:
        body["key"] = key
    return body


#: Longest grant-to-send delay a commit reports, in seconds (an hour).
SENT_AFTER_SECONDS_MAX = 3600.0
#: Most quotas one lesson carries.
LESSON_QUOTAS_MAX = 8
#: Largest quota a lesson carries (2^53); a larger one says no more.
LESSON_QUOTA_MAX = 2**53
#: Longest quota window a lesson carries, in milliseconds (366 days).
LESSON_WINDOW_MS_MAX = 366 * 86_400_000


def commit_body(used: Used, sent_after: float | None) -> dict[str, Any]:
    """The body of ``POST /v1/permits/{id}/commit``; ``sent_after`` in seconds."""
    body: dict[str, Any] = {"used": costs_wire(used, "used") if isinstance(used, Mapping) else used}
    if sent_after is not None:
        body["sent_after_ms"] = milliseconds(sent_after, "sent_after")
    return body


@dataclass(frozen=True)
class Quota:
    """A quota a vendor advertises: ``quota`` calls per ``window`` seconds (``None``: the
    vendor does not say; the limit's own period is assumed)."""

    quota: int
    window: float | None = None


@dataclass(frozen=True)
class Learned:
    """What the server holds as learned for a limit: the ``limit`` in force, whether it was
    ``advertised`` by the vendor or lowered after it answered ``rate_limited``, the lesson's
    ``source``, and the seconds until it is forgotten unless taught again."""

    limit: int
    kind: str
    source: str
    expires_after: float


@dataclass(frozen=True)
class LearnResult:
    """The answer to a lesson: the limit's ``configured`` and ``effective`` value, the seconds
    the server paused it for (``paused``, 0 for none), what it holds as ``learned``, the
    longest grant-to-send ``delay`` callers reported lately and the ``margin`` it learned from
    it (seconds)."""

    limit: str
    configured: int
    effective: int
    paused: float
    learned: Learned | None
    delay: float = 0.0
    margin: float = 0.0


def _quota_ms(quota: Quota | tuple[int, float | None] | int) -> dict[str, Any]:
    if isinstance(quota, Quota):
        count, window = quota.quota, quota.window
    elif isinstance(quota, tuple):
        count, window = quota
    else:
        count, window = quota, None
    item: dict[str, Any] = {"quota": count}
    if window is not None:
        # A window is a length, not a wait: the nearest millisecond.
        if isinstance(window, bool) or not isinstance(window, (int, float)):
            raise TypeError(f"quotas: a window in seconds as a number, got {window!r}")
        if math.isnan(window) or math.isinf(window) or window < 0:
            raise ValueError(f"quotas: a window must be a finite number of seconds, got {window!r}")
        item["window_ms"] = round(window * 1000)
    return item


def learn_body(
    limit: str,
    *,
    source: str,
    quotas: Sequence[Quota | tuple[int, float | None] | int],
    remaining: int | None,
    reset: float | None,
    rate_limited: bool,
) -> dict[str, Any]:
    """The body of ``POST /v1/learn`` from seconds (``window``, ``reset``); the ranges are the
    server's to judge, so that its ``bad_request`` names the field."""
    body: dict[str, Any] = {
        "limit": limit,
        "source": source,
        "quotas": [_quota_ms(quota) for quota in quotas],
    }
    if remaining is not None:
        body["remaining"] = remaining
    if reset is not None:
        body["reset_ms"] = milliseconds(reset, "reset")
    if rate_limited:
        body["rate_limited"] = True
    return body


def learn_result(body: dict[str, Any]) -> LearnResult:
    """The answer of ``POST /v1/learn`` (milliseconds become seconds)."""
    learned = body.get("learned")
    return LearnResult(
        limit=str(body.get("limit", "")),
        configured=int(body.get("configured", 0)),
        effective=int(body.get("effective", 0)),
        paused=_seconds(body.get("paused_ms")),
        learned=(
            Learned(
                limit=int(learned.get("limit", 0)),
                kind=str(learned.get("kind", "")),
                source=str(learned.get("source", "")),
                expires_after=_seconds(learned.get("expires_in_ms")),
            )
            if isinstance(learned, dict)
            else None
        ),
        delay=_seconds(body.get("delay_ms")),
        margin=_seconds(body.get("margin_ms")),
    )


def rule_body(rule: Mapping[str, Any] | None, fields: Mapping[str, Any]) -> dict[str, Any]:
    """A limit's fields for ``PUT /v1/limits/{name}``: a mapping, then keyword fields over it."""
    body: dict[str, Any] = dict(rule) if rule is not None else {}
    body.update(fields)
    return body


def check_answer(body: Any) -> tuple[bool, str, list[str], list[LimitStatus], str | None]:
    """The common part of a ``/v1/check`` answer: allowed, path, matched, limits, permit."""
    if not isinstance(body, dict):
        raise ValueError("the check answer is not a JSON object")
    matched = body.get("matched")
    permit = body.get("permit")
    return (
        bool(body.get("allowed")),
        str(body.get("path", "")),
        [str(name) for name in matched] if isinstance(matched, list) else [],
        parse_limits(body.get("limits")),
        permit if isinstance(permit, str) else None,
    )
