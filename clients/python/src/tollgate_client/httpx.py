"""httpx transports that keep every caller of a vendor inside the vendor's quota, and turn the
vendor's "rate limited, retry after N" into a pause for the whole fleet.

::

    import httpx
    from tollgate_client import Client
    from tollgate_client.httpx import TollgateTransport

    tollgate = Client()  # TOLLGATE_SERVER, else http://127.0.0.1:7070
    vendor = httpx.Client(
        transport=TollgateTransport(tollgate, {"api.vendor.example": "vendor-x"})
    )
    vendor.get("https://api.vendor.example/v1/things")  # takes a unit of vendor-x first

For each request to a mapped host the transport:

1. waits out any pause of the host's limits this process knows of (plus a random jitter, so
   that waiters do not all resume at once), then takes one unit of every limit mapped to the
   host from the Tollgate server, in priority order, waiting up to ``wait_max`` seconds;
2. sends the request through the inner transport;
3. classifies the answer (see :func:`~tollgate_client.default_verdict`): on 429, or 503 with
   ``Retry-After``, it pauses the host's first limit on the server for the vendor's wait (cut
   to ``retry_after_max``, plus jitter, never less than asked), so that every process of the
   fleet holds its requests until the vendor's cessation ends, and retries; on a transient
   failure it retries an idempotent request after a jittered, doubling backoff;
4. reads the vendor's rate-limit headers (the IETF ``RateLimit``/``RateLimit-Policy`` fields,
   or OpenAI's, Anthropic's, GitHub's or the older ``RateLimit-Limit`` ones) and, when they say
   something new (other quotas than last taught, none taught for a minute, no call remaining,
   or a 429 with no quota advertised), teaches the server (``POST /v1/learn``) for the host's
   first limit: the server then holds the limit at most at what the vendor advertises, pauses
   it fleet-wide until the vendor's reset when nothing remains, and lowers it after a 429
   that advertised nothing;
5. commits the unit (the call happened), reporting how long after the grant the request left
   (so that the server's margin covers that delay), and releases the lease of a concurrency
   limit, after recording a pause, so that with a concurrency limit of 1 no other request
   leaves before the pause is in force.

``learn=False`` turns step 4 and the delay report off. A lesson that fails (the token lacks
``may_pause``, the first limit is not a rate limit) is logged at debug level and fails nothing.

Retries (for rate limiting and transient failures together) stop after ``retries_max``; the
last answer then goes back to the caller as the vendor gave it. A request whose body is a
stream cannot be replayed: it is sent once (its rate-limit answer still pauses the host).
Requests to hosts not in the mapping pass through untouched.

When no quota comes within ``wait_max``, the request fails with
:class:`~tollgate_client.RateLimited` (nothing was sent); failures of the Tollgate server
raise the other :class:`~tollgate_client.TollgateError` classes.

Set one request's priority with the request extension ``"tollgate_priority"``:
``vendor.get(url, extensions={"tollgate_priority": "high"})``.

Language-model APIs: ``llm`` maps a host to its token :class:`~tollgate_client.llm.Budget`
(requests, input tokens and output tokens per period). A model call to such a host takes its
estimated tokens and one request before it goes, and is settled on what the answer reports as
it streams (see :mod:`tollgate_client.llm`); other requests go as above. ``hosts`` may then be
empty. A host in both maps has its model calls go through the budget first, then through the
steps above (its vendor's 429 pauses the host's first limit in ``hosts``)::

    budget = Budget(requests="openai-rpm", input="openai-itpm", output="openai-otpm")
    openai = httpx.Client(transport=TollgateTransport(tollgate, {}, llm={"api.openai.com": budget}))
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from ._async import AsyncClient, AsyncPermit
from ._core import logger
from ._dispatch import (
    PRIORITY_EXTENSION,
    Classifier,
    Host,
    Policy,
    Verdict,
    default_verdict,
    idempotent,
    parse_retry_after,
    replayable,
    timed_out_message,
    transient,
)
from ._errors import BadRequest, RateLimited, TollgateError
from ._models import Limits
from ._sync import Client, Permit
from .llm import AsyncLlmTransport, Budget, LlmTransport

__all__ = [
    "PRIORITY_EXTENSION",
    "AsyncTollgateTransport",
    "TollgateTransport",
    "Verdict",
    "default_verdict",
    "parse_retry_after",
]


class _Through(httpx.BaseTransport):
    """What a token budget sends through: the transport's own dispatching."""

    def __init__(self, send: Callable[[httpx.Request], httpx.Response]) -> None:
        self._send = send

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._send(request)


class _AsyncThrough(httpx.AsyncBaseTransport):
    def __init__(self, send: Callable[[httpx.Request], Awaitable[httpx.Response]]) -> None:
        self._send = send

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._send(request)


# The shortest sleep between two asks when the server answers before the deadline.
_ASK_INTERVAL_MIN = 0.01


def _timed_out(
    host: Host, policy: Policy, paused: bool, last: RateLimited | None, retry_after: float
) -> RateLimited:
    return RateLimited(
        timed_out_message(host, policy.wait_max, paused),
        retry_after=retry_after,
        reason="paused" if paused else (last.reason if last is not None else None),
        limits=last.limits if last is not None else [],
        status=last.status if last is not None else None,
    )


# What a lesson may fail with: the server's refusals and failures, or an answer not understood.
_LESSON_ERRORS = (TollgateError, ValueError, TypeError)


def _lesson_failed(policy: Policy, lesson: dict[str, Any], error: Exception) -> None:
    limit = lesson["limit"]
    if isinstance(error, TollgateError) and error.status in (400, 403, 404):
        # Not a rate limit, unknown, or the token may not teach: asking again soon would be
        # refused again.
        policy.lesson_refused(limit)
    logger.debug("lesson for %s not taught: %s", limit, error)


def _delay_unknown(policy: Policy, error: BadRequest) -> bool:
    """Whether a commit was refused for its ``sent_after_ms`` (a server older than it): then
    the delay is not reported again, and the commit is sent without it."""
    if error.field != "sent_after_ms":
        return False
    if policy.report_delay:
        policy.report_delay = False
        logger.debug("the Tollgate server does not take sent_after_ms; not reported: %s", error)
    return True


class TollgateTransport(httpx.BaseTransport):
    """A blocking httpx transport that takes each mapped host's quota from a Tollgate server
    before every request (see the module documentation).

    ``hosts`` maps a host name (``api.vendor.example``, or ``host:port`` for one port) to
    the limit name, or names, its requests take; a vendor's rate-limit answer pauses the first.
    ``transport`` is the transport that does the sending (default ``httpx.HTTPTransport()``;
    pass one to set TLS or proxy options). Times are in seconds:

    - ``wait_max`` (60): longest one attempt waits for quota, pauses included;
    - ``retries_max`` (3): retries after the first attempt;
    - ``backoff`` (0.1) doubling up to ``backoff_max`` (5): wait before retrying a transient
      failure, drawn between half and all of it;
    - ``retry_after_default`` (30): the pause when a vendor's answer gives no readable wait;
    - ``retry_after_max`` (900): the longest pause a vendor can cause;
    - ``resume_jitter_max`` (0.25): a random extra added to every pause;
    - ``classify``: a function of the response returning a :class:`Verdict` to override the
      defaults, or ``None`` to let them decide;
    - ``learn`` (True): teach the server what the vendor's rate-limit headers say, and report
      each call's grant-to-send delay on its commit (``False``: neither; pauses on a
      rate-limit answer stay);
    - ``llm``: host to token :class:`~tollgate_client.llm.Budget`, for language-model APIs
      (see the module documentation).
    """

    def __init__(
        self,
        client: Client,
        hosts: Mapping[str, Limits],
        *,
        transport: httpx.BaseTransport | None = None,
        priority: str = "normal",
        wait_max: float = 60.0,
        retries_max: int = 3,
        backoff: float = 0.1,
        backoff_max: float = 5.0,
        retry_after_default: float = 30.0,
        retry_after_max: float = 900.0,
        resume_jitter_max: float = 0.25,
        classify: Classifier | None = None,
        learn: bool = True,
        llm: Mapping[str, Budget] | None = None,
    ) -> None:
        self._client = client
        self._inner = transport if transport is not None else httpx.HTTPTransport()
        self._policy = Policy(
            hosts,
            priority=priority,
            wait_max=wait_max,
            retries_max=retries_max,
            backoff=backoff,
            backoff_max=backoff_max,
            retry_after_default=retry_after_default,
            retry_after_max=retry_after_max,
            resume_jitter_max=resume_jitter_max,
            classify=classify,
            learn=learn,
            hosts_required=not llm,
        )
        self._llm = LlmTransport(client, llm, transport=_Through(self._dispatch)) if llm else None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._llm is not None:
            # Model calls to a budget's host take their tokens; everything passes on below.
            return self._llm.handle_request(request)
        return self._dispatch(request)

    def _dispatch(self, request: httpx.Request) -> httpx.Response:
        policy = self._policy
        host = policy.host_for(request.url)
        if host is None:
            return self._inner.handle_request(request)
        priority = policy.priority_of(request)
        may_replay = replayable(request)
        retry_transient = may_replay and idempotent(request.method)
        attempt = 0
        while True:
            permit = self._admit(host, priority)
            departure = policy.departure(request, asynchronous=False)
            try:
                response = self._inner.handle_request(request)
            except BaseException as error:
                self._settle(permit, policy.sent_after(permit.granted_at, departure))
                if retry_transient and transient(error) and attempt < policy.retries_max:
                    time.sleep(policy.backoff(attempt))
                    attempt += 1
                    continue
                raise
            finally:
                if departure is not None:
                    departure.done()
            verdict = policy.classify(response)
            if verdict.kind == "retry" and not retry_transient:
                verdict = Verdict.done()
            if verdict.kind == "rate_limited":
                self._pause(host, verdict.retry_after)
            self._teach(host, request, response, verdict)
            self._settle(permit, policy.sent_after(permit.granted_at, departure))
            if verdict.kind == "done" or attempt >= policy.retries_max or not may_replay:
                return response
            response.close()
            if verdict.kind == "retry":
                time.sleep(policy.backoff(attempt))
            attempt += 1

    def _admit(self, host: Host, priority: str) -> Permit:
        """Wait for leave to send one attempt: no pause known, one unit of the host's limits."""
        policy = self._policy
        deadline = time.monotonic() + policy.wait_max
        last: RateLimited | None = None
        while True:
            left = policy.paused_for(host)
            if left > 0:
                resume_at = time.monotonic() + left + policy.jitter()
                if resume_at >= deadline:
                    raise _timed_out(host, policy, True, last, resume_at - time.monotonic())
                time.sleep(max(0.0, resume_at - time.monotonic()))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _timed_out(host, policy, False, last, 0.0)
            try:
                permit = self._client.acquire(list(host.names), priority=priority, wait=remaining)
            except RateLimited as denial:
                last = denial
                if denial.reason == "paused":
                    policy.note_pause(host.pause_target, time.monotonic() + denial.retry_after)
                remaining = deadline - time.monotonic()
                if remaining <= 0.001:
                    raise _timed_out(host, policy, False, last, denial.retry_after) from denial
                time.sleep(min(max(denial.retry_after, _ASK_INTERVAL_MIN), remaining))
                continue
            if policy.paused_for(host) > 0:
                # Granted, but a pause began since: give the unit back, wait with the others.
                try:
                    permit.commit(0)
                except TollgateError as error:
                    logger.debug("refund of a grant held for a pause failed: %s", error)
                continue
            return permit

    def _pause(self, host: Host, retry_after: float | None) -> None:
        """Pause the host here at once, then fleet-wide through the server."""
        pause = self._policy.pause_for(retry_after)
        if pause is None:
            return
        target = host.pause_target
        self._policy.note_pause(target, time.monotonic() + pause)
        try:
            left = self._client.pause(target, pause)
        except TollgateError as error:
            logger.warning(
                "could not pause %s on the Tollgate server; other processes will learn of "
                "the vendor's limit from the vendor: %s",
                target,
                error,
            )
            return
        self._policy.note_pause(target, time.monotonic() + left)

    def _teach(
        self, host: Host, request: httpx.Request, response: httpx.Response, verdict: Verdict
    ) -> None:
        """Teach the server what the vendor's answer says, if it says something new; a pause
        the server puts in force is noted here at once. A failed lesson fails nothing."""
        lesson = self._policy.lesson(host, request, response, verdict)
        if lesson is None:
            return
        try:
            taught = self._client._learn(lesson)
        except _LESSON_ERRORS as error:
            _lesson_failed(self._policy, lesson, error)
            return
        self._policy.taught(lesson)
        if taught.paused > 0:
            self._policy.note_pause(lesson["limit"], time.monotonic() + taught.paused)

    def _settle(self, permit: Permit, sent_after: float | None) -> None:
        # The call happened (or may have): its unit stays used; a lease is released.
        try:
            try:
                permit.commit(sent_after=sent_after)
            except BadRequest as error:
                if not _delay_unknown(self._policy, error):
                    raise
                permit.commit()
        except TollgateError as error:
            logger.debug(
                "commit of permit %s failed; a lease runs to its TTL: %s", permit.id, error
            )

    def close(self) -> None:
        """Close the inner transport (the Tollgate client is the caller's to close)."""
        self._inner.close()


class AsyncTollgateTransport(httpx.AsyncBaseTransport):
    """The asyncio twin of :class:`TollgateTransport`, over an :class:`AsyncClient`; same
    arguments, the inner transport defaulting to ``httpx.AsyncHTTPTransport()``."""

    def __init__(
        self,
        client: AsyncClient,
        hosts: Mapping[str, Limits],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        priority: str = "normal",
        wait_max: float = 60.0,
        retries_max: int = 3,
        backoff: float = 0.1,
        backoff_max: float = 5.0,
        retry_after_default: float = 30.0,
        retry_after_max: float = 900.0,
        resume_jitter_max: float = 0.25,
        classify: Classifier | None = None,
        learn: bool = True,
        llm: Mapping[str, Budget] | None = None,
    ) -> None:
        self._client = client
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()
        self._policy = Policy(
            hosts,
            priority=priority,
            wait_max=wait_max,
            retries_max=retries_max,
            backoff=backoff,
            backoff_max=backoff_max,
            retry_after_default=retry_after_default,
            retry_after_max=retry_after_max,
            resume_jitter_max=resume_jitter_max,
            classify=classify,
            learn=learn,
            hosts_required=not llm,
        )
        self._llm = (
            AsyncLlmTransport(client, llm, transport=_AsyncThrough(self._dispatch)) if llm else None
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._llm is not None:
            return await self._llm.handle_async_request(request)
        return await self._dispatch(request)

    async def _dispatch(self, request: httpx.Request) -> httpx.Response:
        policy = self._policy
        host = policy.host_for(request.url)
        if host is None:
            return await self._inner.handle_async_request(request)
        priority = policy.priority_of(request)
        may_replay = replayable(request)
        retry_transient = may_replay and idempotent(request.method)
        attempt = 0
        while True:
            permit = await self._admit(host, priority)
            departure = policy.departure(request, asynchronous=True)
            try:
                response = await self._inner.handle_async_request(request)
            except BaseException as error:
                await self._settle(permit, policy.sent_after(permit.granted_at, departure))
                if retry_transient and transient(error) and attempt < policy.retries_max:
                    await asyncio.sleep(policy.backoff(attempt))
                    attempt += 1
                    continue
                raise
            finally:
                if departure is not None:
                    departure.done()
            verdict = policy.classify(response)
            if verdict.kind == "retry" and not retry_transient:
                verdict = Verdict.done()
            if verdict.kind == "rate_limited":
                await self._pause(host, verdict.retry_after)
            await self._teach(host, request, response, verdict)
            await self._settle(permit, policy.sent_after(permit.granted_at, departure))
            if verdict.kind == "done" or attempt >= policy.retries_max or not may_replay:
                return response
            await response.aclose()
            if verdict.kind == "retry":
                await asyncio.sleep(policy.backoff(attempt))
            attempt += 1

    async def _admit(self, host: Host, priority: str) -> AsyncPermit:
        """Wait for leave to send one attempt: no pause known, one unit of the host's limits."""
        policy = self._policy
        deadline = time.monotonic() + policy.wait_max
        last: RateLimited | None = None
        while True:
            left = policy.paused_for(host)
            if left > 0:
                resume_at = time.monotonic() + left + policy.jitter()
                if resume_at >= deadline:
                    raise _timed_out(host, policy, True, last, resume_at - time.monotonic())
                await asyncio.sleep(max(0.0, resume_at - time.monotonic()))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _timed_out(host, policy, False, last, 0.0)
            try:
                permit = await self._client.acquire(
                    list(host.names), priority=priority, wait=remaining
                )
            except RateLimited as denial:
                last = denial
                if denial.reason == "paused":
                    policy.note_pause(host.pause_target, time.monotonic() + denial.retry_after)
                remaining = deadline - time.monotonic()
                if remaining <= 0.001:
                    raise _timed_out(host, policy, False, last, denial.retry_after) from denial
                await asyncio.sleep(min(max(denial.retry_after, _ASK_INTERVAL_MIN), remaining))
                continue
            if policy.paused_for(host) > 0:
                try:
                    await permit.commit(0)
                except TollgateError as error:
                    logger.debug("refund of a grant held for a pause failed: %s", error)
                continue
            return permit

    async def _pause(self, host: Host, retry_after: float | None) -> None:
        pause = self._policy.pause_for(retry_after)
        if pause is None:
            return
        target = host.pause_target
        self._policy.note_pause(target, time.monotonic() + pause)
        try:
            left = await self._client.pause(target, pause)
        except TollgateError as error:
            logger.warning(
                "could not pause %s on the Tollgate server; other processes will learn of "
                "the vendor's limit from the vendor: %s",
                target,
                error,
            )
            return
        self._policy.note_pause(target, time.monotonic() + left)

    async def _teach(
        self, host: Host, request: httpx.Request, response: httpx.Response, verdict: Verdict
    ) -> None:
        lesson = self._policy.lesson(host, request, response, verdict)
        if lesson is None:
            return
        try:
            taught = await self._client._learn(lesson)
        except _LESSON_ERRORS as error:
            _lesson_failed(self._policy, lesson, error)
            return
        self._policy.taught(lesson)
        if taught.paused > 0:
            self._policy.note_pause(lesson["limit"], time.monotonic() + taught.paused)

    async def _settle(self, permit: AsyncPermit, sent_after: float | None) -> None:
        try:
            try:
                await permit.commit(sent_after=sent_after)
            except BadRequest as error:
                if not _delay_unknown(self._policy, error):
                    raise
                await permit.commit()
        except TollgateError as error:
            logger.debug(
                "commit of permit %s failed; a lease runs to its TTL: %s", permit.id, error
            )

    async def aclose(self) -> None:
        """Close the inner transport (the Tollgate client is the caller's to close)."""
        await self._inner.aclose()
