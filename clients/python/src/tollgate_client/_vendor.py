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


#: The headers of an answer: httpx's, a mapping, or ``(name, value)`` pairs (a name may
#: repeat).
Headers = Union[httpx.Headers, Mapping[str, str], Sequence[tuple[str, str]]]

#: The largest millisecond value read (2^53); above, a value is unreadable.
_MS_MAX = 2**53


class _Fields:
    """An answer's headers by lower-case name, each field's lines joined with ``", "``, as
    bytes (the 256-byte bound counts bytes on the wire)."""

    def __init__(self, headers: Headers) -> None:
        pairs: list[tuple[bytes, bytes]]
        if isinstance(headers, httpx.Headers):
            pairs = [(name.lower(), value) for name, value in headers.raw]
        else:
            items = headers.items() if isinstance(headers, Mapping) else headers
            pairs = [(name.lower().encode(), value.encode()) for name, value in items]
        self._lines: dict[str, list[bytes]] = {}
        for name, value in pairs:
            self._lines.setdefault(name.decode("latin-1"), []).append(value)

    def __contains__(self, name: str) -> bool:
        return name in self._lines

    def get(self, name: str) -> str | None:
        """The field trimmed, or ``None`` if absent or longer than the bound."""
        lines = self._lines.get(name)
        if lines is None:
            return None
        raw = b", ".join(lines)
        if len(raw) > HEADER_BYTES_MAX:
            return None
        # Latin-1 maps each byte to one character: bytes beyond ASCII stay unreadable.
        return raw.decode("latin-1").strip(_OWS)


def _int(text: str | None) -> int | None:
    if text is None or not _INT.fullmatch(text):
        return None
    return int(text)


def _ms(value: int | None) -> int | None:
    return value if value is not None and value <= _MS_MAX else None


def _quotas(*pairs: tuple[int | None, int | None]) -> tuple[AdvisedQuota, ...]:
    kept = [AdvisedQuota(quota, window) for quota, window in pairs if quota]
    return tuple(kept[:QUOTAS_MAX])


# ---- ietf: structured-field lists ------------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z*][A-Za-z0-9!#$%&'*+\-.^_`|~:/]*")
_QUOTED = re.compile(r'"((?:[ !#-\[\]-~]|\\["\\])*)"')


class _Unterminated(Exception):
    pass


def _split(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside quoted strings, each part trimmed."""
    parts = []
    start = 0
    quoted = False
    at = 0
    while at < len(text):
        char = text[at]
        if quoted:
            if char == "\\":
                at += 1
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char == separator:
            parts.append(text[start:at].strip(_OWS))
            start = at + 1
        at += 1
    if quoted:
        raise _Unterminated
    parts.append(text[start:].strip(_OWS))
    return parts


def _name(text: str) -> str | None:
    """A member's name or a ``qu`` value: a quoted string or a token, else ``None``."""
    if (match := _QUOTED.fullmatch(text)) is not None:
        return re.sub(r"\\(.)", r"\1", match.group(1))
    if _TOKEN.fullmatch(text):
        return text
    return None


def _members(text: str | None) -> list[dict[str, str]]:
    """The parameters of each member of a structured-field list whose name reads; none
    when the field is absent or unreadable."""
    if text is None:
        return []
    try:
        members = [member for member in _split(text, ",") if member]
        parsed = []
        for member in members:
            name, *params = _split(member, ";")
            if _name(name) is None:
                continue
            values: dict[str, str] = {}
            for param in params:
                key, equals, value = param.partition("=")
                if equals:
                    values[key.strip(_OWS)] = value.strip(_OWS)
            parsed.append(values)
        return parsed
    except _Unterminated:
        return []


def _ietf(fields: _Fields) -> Advice:
    quotas: list[tuple[int | None, int | None]] = []
    for params in _members(fields.get("ratelimit-policy")):
        if "qu" in params and _name(params["qu"]) != "requests":
            continue
        quota = _int(params.get("q"))
        if not quota:
            continue
        window_ms: int | None = None
        if "w" in params:
            window = _int(params["w"])
            window_ms = _ms(window * 1000) if window else None
            if window_ms is None:
                continue
        quotas.append((quota, window_ms))
    pairs = [
        (_int(params.get("r")), _ms(t * 1000) if (t := _int(params.get("t"))) is not None else None)
        for params in _members(fields.get("ratelimit"))
    ]
    rs = [r for r, _ in pairs if r is not None]
    remaining = min(rs) if rs else None
    reset_ms: int | None = None
    if 0 in rs:
        # With a quota exhausted, no call may go until every exhausted one comes back.
        exhausted = [t for r, t in pairs if r == 0 and t is not None]
        reset_ms = max(exhausted) if exhausted else None
    else:
        resets = [t for _, t in pairs if t is not None]
        reset_ms = min(resets) if resets else None
    return Advice("ietf", _quotas(*quotas), remaining, reset_ms)


# ---- openai: Go durations --------------------------------------------------------------------

_DURATION = re.compile(r"(?:[0-9]{1,16}(?:\.[0-9]{1,9})?(?:ms|h|m|s))+")
_DURATION_PART = re.compile(r"([0-9]{1,16}(?:\.[0-9]{1,9})?)(ms|h|m|s)")
_UNIT_MS = {"h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}


def _go_duration_ms(text: str | None) -> int | None:
    """A Go duration (``1h2m3.5s``, ``20ms``, ``0s``) in milliseconds, rounded up; exact
    decimal arithmetic, so that ``1.1s`` is 1100."""
    if text is None or not _DURATION.fullmatch(text):
        return None
    total = sum(
        (Fraction(number) * _UNIT_MS[unit] for number, unit in _DURATION_PART.findall(text)),
        Fraction(0),
    )
    return _ms(math.ceil(total))


# ---- anthropic: RFC 3339 date-times ----------------------------------------------------------

_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _rfc3339_ms(text: str | None) -> Fraction | None:
    """Milliseconds since the epoch of an RFC 3339 date-time, exactly."""
    if text is None or (match := _RFC3339.fullmatch(text)) is None:
        return None
    year, month, day, hour, minute, second, fraction, offset = match.groups()
    try:
        zone = timezone.utc
        if offset not in ("Z", "z"):
            hours, minutes = int(offset[1:3]), int(offset[4:6])
            if hours > 23 or minutes > 59:
                return None
            delta = timedelta(hours=hours, minutes=minutes)
            zone = timezone(-delta if offset[0] == "-" else delta)
        when = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=zone
        )
    except ValueError:  # 29 February of a common year, hour 24, second 60 and the like
        return None
    since = when - _EPOCH
    millis = Fraction(since.days * 86_400 + since.seconds) * 1000
    if fraction:
        millis += Fraction(int(fraction), 10 ** len(fraction)) * 1000
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


def _reset_ms(family: str, text: str | None, now_ms: int) -> int | None:
    if family == "openai":
        return _go_duration_ms(text)
    if family == "anthropic":
        at = _rfc3339_ms(text)
        return None if at is None else _ms(max(0, math.ceil(at - now_ms)))
    value = _int(text)
    if value is None or value * 1000 > _MS_MAX:
        return None
    if family == "github":  # epoch seconds
        return max(0, value * 1000 - now_ms)
    return value * 1000  # ietf-draft: seconds from now


def read_advice(headers: Headers, now_ms: int) -> Advice | None:
    """What an answer's ``headers`` say of the vendor's limits, read at the wall-clock time
    ``now_ms`` (milliseconds since the epoch); ``None`` when no family is present."""
    fields = _Fields(headers)
    for family, names in _FAMILIES:
        if not any(name in fields for name in names):
            continue
        if family == "ietf":
            return _ietf(fields)
        limit, remaining, reset = (fields.get(name) for name in names)
        return Advice(
            family, _quotas((_int(limit), None)), _int(remaining), _reset_ms(family, reset, now_ms)
        )
    return None
