"""The vendor-call protocol of the httpx transports, free of I/O: reading ``Retry-After``,
classifying a vendor's answer, the bounds on pauses and retries, and what this process knows
of pauses in force.

The classification, in order (a user rule, if given, runs first):

- HTTP 429: the vendor is rate limiting; pause the host for its ``Retry-After`` (or the
  configured default when there is none that can be read).
- HTTP 503 **with** a ``Retry-After`` header: load shedding with a stated wait; the same.
- HTTP 500, 502, 503 (without ``Retry-After``), 504 and 408, and connection failures and
  timeouts: transient; retried after a jittered backoff, for idempotent methods only.
- anything else: the answer goes back to the caller unchanged.

It also decides the lessons a transport teaches the server from a vendor's rate-limit headers
(see :mod:`tollgate_client._vendor`): one only when it says something new.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Literal, Optional

import httpx

from ._models import (
    LESSON_QUOTA_MAX,
    LESSON_WINDOW_MS_MAX,
    PRIORITIES,
    SENT_AFTER_SECONDS_MAX,
    Limits,
    limit_names,
)
from ._vendor import AdvisedQuota, read_advice

__all__ = [
    "PRIORITY_EXTENSION",
    "RETRY_AFTER_BYTES_MAX",
    "Verdict",
    "default_verdict",
    "parse_retry_after",
]

#: Longest ``Retry-After`` value read, in bytes; an HTTP-date is 29.
RETRY_AFTER_BYTES_MAX = 64
#: Most retries a transport may be configured for.
RETRIES_MAX_LIMIT = 100
#: Longest pause the server takes (a day), in seconds.
PAUSE_SECONDS_MAX = 24 * 3600.0
#: The request extension that sets one request's priority: ``extensions={PRIORITY_EXTENSION:
#: "high"}`` on an httpx request.
PRIORITY_EXTENSION = "tollgate_priority"

_DAYS = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_LONG_DAYS = r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH = "(" + "|".join(_MONTHS) + ")"
_TIME = r"(\d{2}):(\d{2}):(\d{2})"
# RFC 9110 section 5.6.7: the preferred form, then the two obsolete ones.
_IMF_FIXDATE = re.compile(rf"{_DAYS}, (\d{{2}}) {_MONTH} (\d{{4}}) {_TIME} GMT")
_RFC850_DATE = re.compile(rf"{_LONG_DAYS}, (\d{{2}})-{_MONTH}-(\d{{2}}) {_TIME} GMT")
_ASCTIME_DATE = re.compile(rf"{_DAYS} {_MONTH} ( \d|\d{{2}}) {_TIME} (\d{{4}})")

#: A lesson that says nothing new is sent again after this long (seconds), so that the
#: server, which forgets what it learned after a while, keeps it while the vendor says it.
LESSON_REPEAT_SECONDS = 60.0
#: How long a limit the server refused to be taught for (no ``may_pause``, not a rate limit,
#: unknown) is left alone, in seconds.
LESSON_REFUSED_SECONDS = 60.0
#: Longest lesson source, in bytes.
LESSON_SOURCE_BYTES_MAX = 128

_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})
_TRANSIENT_STATUSES = frozenset({500, 502, 503, 504, 408})


def _http_date(text: str, now: float) -> float | None:
    """Seconds since the epoch of an HTTP-date in any of its three forms, or ``None``."""
    if match := _IMF_FIXDATE.fullmatch(text):
        day, month, year, hour, minute, second = match.groups()
    elif match := _RFC850_DATE.fullmatch(text):
        day, month, year_2, hour, minute, second = match.groups()
        # A two-digit year more than 50 years ahead is the latest such year in the past.
        this_year = datetime.fromtimestamp(now, timezone.utc).year
        century_year = this_year - this_year % 100 + int(year_2)
        year = str(century_year - 100 if century_year > this_year + 50 else century_year)
    elif match := _ASCTIME_DATE.fullmatch(text):
        month, day, hour, minute, second, year = match.groups()
    else:
        return None
    try:
        when = datetime(
            int(year),
            _MONTHS.index(month) + 1,
            int(day),
            int(hour),
            int(minute),
            int(second),
            tzinfo=timezone.utc,
        )
        return when.timestamp()
    except ValueError:  # 32 Nov, 25:00 and the like
        return None


def parse_retry_after(value: str | bytes, now: float | None = None) -> float | None:
    """The wait a ``Retry-After`` value asks for, in seconds, measured from ``now`` (seconds
    since the epoch; default the wall clock).

    Whole seconds (``"120"``), or an HTTP-date in any of the three forms HTTP allows (zero if
    it is past: no wait is invented). Anything else (empty, negative, fractional, a malformed
    date, longer than :data:`RETRY_AFTER_BYTES_MAX`) is ``None``, never a guess: the caller
    falls back to its default.
    """
    if len(value) > RETRY_AFTER_BYTES_MAX:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    text = value.strip()
    if not text or not text.isascii():
        return None
    if text.isdigit():
        # Huge values are a vendor asking for a long wait: saturate, the caller caps it.
        return float(min(int(text), 2**63))
    if now is None:
        now = time.time()
    at = _http_date(text, now)
    return None if at is None else max(0.0, at - now)


@dataclass(frozen=True)
class Verdict:
    """What to do with a vendor's answer.

    ``kind`` is ``done`` (hand it to the caller), ``retry`` (transient: retry after a backoff)
    or ``rate_limited`` (pause the host fleet-wide for ``retry_after`` seconds, or the
    configured default when ``None``, then retry).
    """

    kind: Literal["done", "retry", "rate_limited"]
    retry_after: float | None = None

    @staticmethod
    def done() -> Verdict:
        return Verdict("done")

    @staticmethod
    def retry() -> Verdict:
        return Verdict("retry")

    @staticmethod
    def rate_limited(retry_after: float | None = None) -> Verdict:
        return Verdict("rate_limited", retry_after)


def default_verdict(status: int, headers: Mapping[str, str], now: float | None = None) -> Verdict:
    """The default classification of an HTTP answer (see the module documentation)."""
    header = headers.get("retry-after")
    retry_after = parse_retry_after(header, now) if header is not None else None
    if status == 429 or (status == 503 and header is not None):
        return Verdict.rate_limited(retry_after)
    if status in _TRANSIENT_STATUSES:
        return Verdict.retry()
    return Verdict.done()


def transient(error: BaseException) -> bool:
    """Whether a transport failure may pass: no connection, or a timeout."""
    return isinstance(error, (httpx.ConnectError, httpx.TimeoutException))


def idempotent(method: str) -> bool:
    return method.upper() in _IDEMPOTENT


def replayable(request: httpx.Request) -> bool:
    """Whether the request's body can be sent again (it is held in memory, not a stream)."""
    try:
        request.content  # noqa: B018 - raises for a stream not read
    except httpx.RequestNotRead:
        return False
    return True


#: A user rule: a verdict to decide, ``None`` to let the defaults decide.
Classifier = Callable[[httpx.Response], Optional[Verdict]]


@dataclass(frozen=True)
class Host:
    """The limits a host's requests take, all or none; pauses go on the first."""

    names: tuple[str, ...]

    @property
    def pause_target(self) -> str:
        return self.names[0]


def _positive(name: str, value: float, *, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise TypeError(f"{name}: seconds as a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name}: must be {'at least 0' if allow_zero else 'above 0'}")
    return float(value)


class Policy:
    """A transport's configuration, its host map, and the pauses this process knows of."""

    def __init__(
        self,
        hosts: Mapping[str, Limits],
        *,
        priority: str,
        wait_max: float,
        retries_max: int,
        backoff: float,
        backoff_max: float,
        retry_after_default: float,
        retry_after_max: float,
        resume_jitter_max: float,
        classify: Classifier | None,
        learn: bool = True,
        hosts_required: bool = True,
    ) -> None:
        if not isinstance(learn, bool):
            raise TypeError(f"learn: True or False, got {learn!r}")
        if priority not in PRIORITIES:
            raise ValueError(f"priority: must be high, normal or low, got {priority!r}")
        if not hosts and hosts_required:
            raise ValueError("hosts: map at least one host to its limits (or give llm)")
        self.hosts: dict[str, Host] = {
            host.lower(): Host(tuple(limit_names(limits))) for host, limits in hosts.items()
        }
        self.priority = priority
        self.wait_max = _positive("wait_max", wait_max, allow_zero=False)
        if isinstance(retries_max, bool) or not isinstance(retries_max, int):
            raise TypeError("retries_max: an int")
        if not 0 <= retries_max <= RETRIES_MAX_LIMIT:
            raise ValueError(f"retries_max: must be between 0 and {RETRIES_MAX_LIMIT}")
        self.retries_max = retries_max
        self.backoff_base = _positive("backoff", backoff)
        self.backoff_max = _positive("backoff_max", backoff_max)
        if self.backoff_base > self.backoff_max:
            raise ValueError("backoff: must be at most backoff_max")
        self.retry_after_default = _positive(
            "retry_after_default", retry_after_default, allow_zero=False
        )
        self.retry_after_max = _positive("retry_after_max", retry_after_max)
        if self.retry_after_default > self.retry_after_max:
            raise ValueError("retry_after_default: must be at most retry_after_max")
        self.resume_jitter_max = _positive("resume_jitter_max", resume_jitter_max)
        if self.retry_after_max + self.resume_jitter_max > PAUSE_SECONDS_MAX:
            raise ValueError(
                "retry_after_max: with resume_jitter_max, must be at most a day (86400 s)"
            )
        self.user_classify = classify
        self.learn = learn
        # Cleared when the server does not know ``sent_after_ms`` (one older than it).
        self.report_delay = learn
        self._paused_until: dict[str, float] = {}
        # Per limit: the quotas last taught and when (monotonic); and refusals' ends.
        self._taught: dict[str, tuple[tuple[AdvisedQuota, ...], float]] = {}
        # Limits whose last quotas were sent and not yet taken.
        self._pending: set[str] = set()
        self._refused_until: dict[str, float] = {}
        self._lock = threading.Lock()

    def host_for(self, url: httpx.URL) -> Host | None:
        """The host entry for a request's URL: ``host:port`` first, then ``host``."""
        host = url.host.lower()
        if url.port is not None:
            entry = self.hosts.get(f"{host}:{url.port}")
            if entry is not None:
                return entry
        return self.hosts.get(host)

    def priority_of(self, request: httpx.Request) -> str:
        value = request.extensions.get(PRIORITY_EXTENSION, self.priority)
        return value if isinstance(value, str) else self.priority

    def classify(self, response: httpx.Response) -> Verdict:
        if self.user_classify is not None:
            verdict = self.user_classify(response)
            if verdict is not None:
                return verdict
        return default_verdict(response.status_code, response.headers)

    def pause_for(self, retry_after: float | None) -> float | None:
        """The pause for a rate-limit answer: the vendor's wait (cut to ``retry_after_max``)
        or the default, plus a random resumption jitter, never less than asked. ``None`` when
        the vendor asked for no wait: no pause is invented."""
        asked = self.retry_after_default if retry_after is None else retry_after
        asked = min(asked, self.retry_after_max)
        if asked <= 0:
            return None
        return asked + self.jitter()

    def jitter(self) -> float:
        return random.uniform(0.0, self.resume_jitter_max)

    def backoff(self, attempt: int) -> float:
        """The wait before retry ``attempt + 1``: ``backoff * 2**attempt`` capped at
        ``backoff_max``, drawn between half and all of it."""
        full = min(self.backoff_base * 2.0 ** min(attempt, 62), self.backoff_max)
        return random.uniform(full / 2, full)

    def paused_for(self, host: Host) -> float:
        """Seconds until the pause this process knows of on the host's limits ends (0: none)."""
        now = time.monotonic()
        with self._lock:
            until = max((self._paused_until.get(name, 0.0) for name in host.names), default=0.0)
        return max(0.0, until - now)

    def note_pause(self, limit: str, until: float) -> None:
        """Remember a pause of ``limit`` until ``until`` (monotonic); pauses only extend."""
        with self._lock:
            if self._paused_until.get(limit, 0.0) < until:
                self._paused_until[limit] = until

    def departure(self, request: httpx.Request, *, asynchronous: bool) -> Departure | None:
        """A clock of when ``request`` leaves, started now; ``None`` when not learning."""
        if not self.report_delay:
            return None
        return Departure(request, asynchronous=asynchronous)

    @staticmethod
    def sent_after(granted_at: float, departure: Departure | None) -> float | None:
        """The grant-to-send delay a commit reports (seconds), ``None`` when not learning."""
        if departure is None:
            return None
        return min(max(0.0, departure.at - granted_at), SENT_AFTER_SECONDS_MAX)

    def taught(self, lesson: dict[str, Any]) -> None:
        """The server took ``lesson``: its quotas are in force, and not taught again until they
        change or :data:`LESSON_REPEAT_SECONDS` pass."""
        with self._lock:
            self._pending.discard(lesson["limit"])

    def lesson(
        self, host: Host, request: httpx.Request, response: httpx.Response, verdict: Verdict
    ) -> dict[str, Any] | None:
        """The body of the lesson to teach after a vendor's answer, or ``None`` when there is
        nothing new to say: taught for the host's first limit when the quotas advertised
        differ from the last taught (or those are older than :data:`LESSON_REPEAT_SECONDS`),
        when no call remains, or when the vendor refused a call without advertising a quota.
        Until the server takes it (:meth:`taught`), a caller that reads the same quotas teaches
        them too."""
        if not self.learn:
            return None
        advice = read_advice(response.headers, time.time_ns() // 1_000_000)
        quotas = advice.quotas if advice is not None else ()
        rate_limited = verdict.kind == "rate_limited" and not quotas
        if advice is None and not rate_limited:
            return None
        remaining = advice.remaining if advice is not None else None
        target = host.pause_target
        now = time.monotonic()
        with self._lock:
            if self._refused_until.get(target, 0.0) > now:
                return None
            last = self._taught.get(target)
            fresh = bool(quotas) and (
                last is None or last[0] != quotas or now - last[1] > LESSON_REPEAT_SECONDS
            )
            # Quotas on their way to the server are taught again by every caller that reads
            # them, each waiting for its answer, rather than asking for its next grant under the
            # limit the vendor just refused.
            fresh = fresh or (bool(quotas) and target in self._pending)
            if not (fresh or remaining == 0 or rate_limited):
                return None
            self._taught[target] = (quotas, now)
            if quotas:
                self._pending.add(target)
        said = [f"HTTP {response.status_code}"] if rate_limited else []
        if advice is not None:
            said.append(f"{advice.family} headers")
        source = f"{', '.join(said)} from {request.url.netloc.decode('ascii', 'replace')}"
        body: dict[str, Any] = {
            "limit": target,
            "source": lesson_source(source),
            "quotas": [wire_quota(quota) for quota in quotas],
        }
        if remaining is not None:
            body["remaining"] = remaining
        if advice is not None and advice.reset_ms is not None:
            body["reset_ms"] = advice.reset_ms
        if rate_limited:
            body["rate_limited"] = True
        return body

    def lesson_refused(self, limit: str) -> None:
        """The server will not be taught for ``limit``: leave it alone for a while."""
        with self._lock:
            self._refused_until[limit] = time.monotonic() + LESSON_REFUSED_SECONDS


_HEADERS_SENT = ".send_request_headers.complete"


class Departure:
    """When a request left for the vendor: when it was handed to the inner transport, then,
    if that transport is httpx's own (httpcore reports its steps through the ``trace``
    request extension), when its headers were written, after any connection set-up and TLS
    handshake. A caller's own ``trace`` is still called, and put back by :meth:`done`."""

    def __init__(self, request: httpx.Request, *, asynchronous: bool) -> None:
        #: ``time.monotonic()`` of the departure as known so far.
        self.at = time.monotonic()
        self._request = request
        self._had_trace = "trace" in request.extensions
        own = request.extensions.get("trace")
        if asynchronous:

            async def atrace(name: str, info: dict[str, Any]) -> None:
                if name.endswith(_HEADERS_SENT):
                    self.at = time.monotonic()
                if own is not None:
                    await own(name, info)

            request.extensions["trace"] = atrace
        else:

            def trace(name: str, info: dict[str, Any]) -> None:
                if name.endswith(_HEADERS_SENT):
                    self.at = time.monotonic()
                if own is not None:
                    own(name, info)

            request.extensions["trace"] = trace
        self._own = own

    def done(self) -> None:
        """Give the request its own ``trace`` back (the request may be sent again)."""
        if self._had_trace:
            self._request.extensions["trace"] = self._own
        else:
            self._request.extensions.pop("trace", None)


def wire_quota(quota: AdvisedQuota) -> dict[str, Any]:
    """A quota as ``POST /v1/learn`` takes it, within the ranges the server takes."""
    item: dict[str, Any] = {"quota": min(quota.quota, LESSON_QUOTA_MAX)}
    if quota.window_ms:  # a window of 0 says nothing
        item["window_ms"] = min(quota.window_ms, LESSON_WINDOW_MS_MAX)
    return item


def lesson_source(text: str) -> str:
    """``text`` as a lesson's source: printable ASCII, at most 128 bytes."""
    printable = "".join(char if " " <= char <= "~" else "?" for char in text)
    return printable[:LESSON_SOURCE_BYTES_MAX]


def timed_out_message(host: Host, wait_max: float, paused: bool) -> str:
    names = ", ".join(host.names)
    return f"no quota on {names} within {wait_max:g} s" + (" (paused)" if paused else "")
