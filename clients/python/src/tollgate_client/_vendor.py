"""Reading a vendor's rate-limit headers ("advice"), free of I/O.

Five header families are read, the first with any of its headers present winning: ``ietf``
(``RateLimit-Policy`` and ``RateLimit``, structured fields), ``openai``
(``x-ratelimit-*-requests``), ``anthropic`` (``anthropic-ratelimit-requests-*``), ``github``
(``x-ratelimit-limit``, ``-remaining``, ``-reset``) and ``ietf-draft`` (``RateLimit-Limit``,
``-Remaining``, ``-Reset``). A value that cannot be read (or is longer than
:data:`HEADER_BYTES_MAX`) leaves its field empty: never an error, never a guess. The Rust
dispatcher and the TypeScript client read the same way, held to the same shared vectors.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from typing import Any, Union

import httpx

__all__ = ["HEADER_BYTES_MAX", "QUOTAS_MAX", "Advice", "AdvisedQuota", "read_advice"]

#: Longest header value read, in bytes; a longer one is treated as absent.
HEADER_BYTES_MAX = 256
#: Most quotas kept from one answer (the first ones).
QUOTAS_MAX = 8

_INT = re.compile(r"[0-9]{1,16}")
_OWS = " \t"


@dataclass(frozen=True)
class AdvisedQuota:
    """One quota a vendor advertises: ``quota`` calls per ``window_ms`` (``None``: unsaid)."""

    quota: int
    window_ms: int | None = None


@dataclass(frozen=True)
class Advice:
    """What a vendor's answer says of its limits: the header ``family`` read, the ``quotas``
    advertised, the calls ``remaining`` and the milliseconds until a unit comes back
    (``reset_ms``), each ``None`` when unsaid or unreadable."""

    family: str
    quotas: tuple[AdvisedQuota, ...] = ()
    remaining: int | None = None
    reset_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The advice as the shared vectors write it."""
        return {
            "family": self.family,
            "quotas": [{"quota": q.quota, "window_ms": q.window_ms} for q in self.quotas],
            "remaining": self.remaining,
            "reset_ms": self.reset_ms,
        }


Headers = Union[httpx.Headers, Mapping[str, str], Sequence[tuple[str, str]]]


def _value(headers: httpx.Headers, name: str) -> str | None:
    """The header's value trimmed, or ``None`` if absent or too long."""
    raw: str | None = headers.get(name)
    if raw is None or len(raw.encode("utf-8", "surrogateescape")) > HEADER_BYTES_MAX:
        return None
    return raw.strip(_OWS)


def _int(text: str | None) -> int | None:
    if text is None or not _INT.fullmatch(text):
        return None
    return int(text)


def _quotas(*pairs: tuple[int | None, int | None]) -> tuple[AdvisedQuota, ...]:
    kept = [AdvisedQuota(quota, window) for quota, window in pairs if quota]
    return tuple(kept[:QUOTAS_MAX])


# ---- ietf: structured-field lists ------------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z*][A-Za-z0-9!#$%&'*+\-.^_`|~:/]*")
_KEY = re.compile(r"[a-z*][a-z0-9_\-.*]*")
_BARE = re.compile(
    r"-?[0-9]+(?:\.[0-9]+)?|[A-Za-z*][A-Za-z0-9!#$%&\'*+\-.^_`|~:/]*|\?[01]|:[A-Za-z0-9+/=]*:"
)

# One parameter's value: an int (digits), a string, or something else this reader skips.
_Param = Union[int, str, None]


class _Unreadable(Exception):
    pass


def _string(text: str, at: int) -> tuple[str, int]:
    """A quoted string starting at ``text[at] == '"'``; returns it and the index after."""
    out = []
    at += 1
    while at < len(text):
        char = text[at]
        if char == "\\":
            if at + 1 >= len(text) or text[at + 1] not in '"\\':
                raise _Unreadable
            out.append(text[at + 1])
            at += 2
        elif char == '"':
            return "".join(out), at + 1
        elif not " " <= char <= "~":
            raise _Unreadable
        else:
            out.append(char)
            at += 1
    raise _Unreadable


def _bare_item(text: str, at: int) -> tuple[_Param, int]:
    if at < len(text) and text[at] == '"':
        return _string(text, at)
    match = _BARE.match(text, at)
    if match is None:
        raise _Unreadable
    item = match.group()
    return (int(item) if _INT.fullmatch(item) else None), match.end()


def _list(text: str) -> list[tuple[str, dict[str, _Param]]]:
    """A structured-field list of items, each a name (string or token) with parameters."""
    items: list[tuple[str, dict[str, _Param]]] = []
    at = 0
    size = len(text)
    while at < size:
        if text[at] == '"':
            name, at = _string(text, at)
        else:
            match = _TOKEN.match(text, at)
            if match is None:
                raise _Unreadable
            name, at = match.group(), match.end()
        params: dict[str, _Param] = {}
        while at < size and text[at] == ";":
            at += 1
            while at < size and text[at] == " ":
                at += 1
            match = _KEY.match(text, at)
            if match is None:
                raise _Unreadable
            key, at = match.group(), match.end()
            value: _Param = None
            if at < size and text[at] == "=":
                value, at = _bare_item(text, at + 1)
            params[key] = value
        items.append((name, params))
        while at < size and text[at] in _OWS:
            at += 1
        if at == size:
            break
        if text[at] != ",":
            raise _Unreadable
        at += 1
        while at < size and text[at] in _OWS:
            at += 1
        if at == size:
            raise _Unreadable  # a trailing comma
    return items


def _read_list(text: str | None) -> list[tuple[str, dict[str, _Param]]] | None:
    if text is None:
        return None
    try:
        return _list(text)
    except _Unreadable:
        return None


def _int_param(params: dict[str, _Param], key: str) -> int | None:
    value = params.get(key)
    return value if isinstance(value, int) else None


def _ietf(headers: httpx.Headers) -> Advice:
    quotas: list[tuple[int | None, int | None]] = []
    for _, params in _read_list(_value(headers, "ratelimit-policy")) or []:
        unit = params.get("qu", "requests")
        if unit != "requests":
            continue
        quota = _int_param(params, "q")
        window = _int_param(params, "w")
        quotas.append((quota, None if window is None else window * 1000))
    remaining: int | None = None
    reset_ms: int | None = None
    items = _read_list(_value(headers, "ratelimit")) or []
    pairs = [(_int_param(params, "r"), _int_param(params, "t")) for _, params in items]
    rs = [r for r, _ in pairs if r is not None]
    if rs:
        remaining = min(rs)
    # With a quota exhausted, no call may go until every exhausted one comes back.
    exhausted = [t for r, t in pairs if r == 0 and t is not None]
    ts = [t for _, t in pairs if t is not None]
    if exhausted:
        reset_ms = max(exhausted) * 1000
    elif ts:
        reset_ms = min(ts) * 1000
    return Advice("ietf", _quotas(*quotas), remaining, reset_ms)


# ---- openai: Go durations --------------------------------------------------------------------

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ms|h|m|s)")
_UNIT_MS = {"h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}


def _go_duration_ms(text: str | None) -> int | None:
    """A Go duration (``1h2m3.5s``, ``20ms``, ``0s``) in milliseconds, rounded up."""
    if not text:
        return None
    total = Fraction(0)
    at = 0
    while at < len(text):
        match = _DURATION_PART.match(text, at)
        if match is None:
            return None
        number, unit = match.groups()
        total += Fraction(number if not number.endswith(".") else number[:-1]) * _UNIT_MS[unit]
        at = match.end()
    return math.ceil(total)


# ---- anthropic: RFC 3339 date-times ----------------------------------------------------------

_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _rfc3339_ms(text: str | None) -> Fraction | None:
    """Milliseconds since the epoch of an RFC 3339 date-time, exactly."""
    if text is None:
        return None
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    try:
        if offset in ("Z", "z"):
            zone = timezone.utc
        else:
            hours, minutes = int(offset[1:3]), int(offset[4:6])
            if hours > 23 or minutes > 59:
                return None
            delta = timedelta(hours=hours, minutes=minutes)
            zone = timezone(-delta if offset[0] == "-" else delta)
        when = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=zone
        )
    except ValueError:
        return None
    whole = when - _EPOCH
    millis = Fraction(whole.days * 86_400 + whole.seconds) * 1000
    if fraction:
        millis += Fraction(fraction[1:]) / 10 ** (len(fraction) - 1) * 1000
    return millis


# ---- the families ----------------------------------------------------------------------------

_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ietf", ("ratelimit-policy", "ratelimit")),
    (
        "openai",
        (
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ),
    ),
    (
        "anthropic",
        (
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ),
    ),
    ("github", ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset")),
    ("ietf-draft", ("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset")),
)


def read_advice(headers: Headers, now_ms: int) -> Advice | None:
    """What an answer's ``headers`` say of the vendor's limits, read at the wall-clock time
    ``now_ms`` (milliseconds since the epoch); ``None`` when no family is present."""
    if not isinstance(headers, httpx.Headers):
        headers = httpx.Headers(headers)
    for family, names in _FAMILIES:
        if not any(name in headers for name in names):
            continue
        if family == "ietf":
            return _ietf(headers)
        limit = _int(_value(headers, names[0]))
        remaining = _int(_value(headers, names[1]))
        reset_text = _value(headers, names[2])
        reset_ms: int | None
        if family == "openai":
            reset_ms = _go_duration_ms(reset_text)
        elif family == "anthropic":
            at = _rfc3339_ms(reset_text)
            reset_ms = None if at is None else max(0, math.ceil(at - now_ms))
        elif family == "github":
            epoch = _int(reset_text)
            reset_ms = None if epoch is None else max(0, epoch * 1000 - now_ms)
        else:
            seconds = _int(reset_text)
            reset_ms = None if seconds is None else seconds * 1000
        return Advice(family, _quotas((limit, None)), remaining, reset_ms)
    return None
