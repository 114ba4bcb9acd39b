"""The blocking client: :class:`Client`, its :class:`Permit` and its admin API."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Callable, TypeVar, cast

import httpx

from ._core import (
    DEFAULT_TIMEOUT,
    Options,
    bearer,
    decode_object,
    granted_at,
    limit_path,
    logger,
    permit_path,
    proof_failed,
    unreachable,
)
from ._errors import RateLimited, ServerError, TollgateError, error_from_response
from ._kept import KeptToken, proof_nonce
from ._models import (
    Charged,
    CheckResult,
    Committed,
    Costs,
    LearnResult,
    LimitList,
    Limits,
    LimitStatus,
    Quota,
    Used,
    acquire_body,
    all_units,
    charge_body,
    check_answer,
    commit_body,
    learn_body,
    learn_result,
    parse_charged,
    parse_limits,
    pause_body,
    rule_body,
)

F = TypeVar("F", bound=Callable[..., Any])


class Permit:
    """What an acquire granted: rate units, and a lease for each concurrency limit.

    Used as a context manager, a clean exit commits ``used`` units (all that was granted unless
    ``used`` was set in the block) and releases any lease. An exception commits nothing: the
    rate units stay spent (the call may have happened) and any lease is released. After an
    explicit :meth:`commit` or :meth:`release`, leaving the block does nothing more.
    """

    def __init__(
        self,
        client: Client,
        permit_id: str,
        limits: list[LimitStatus],
        cost: int,
        costs: Costs | None = None,
    ):
        self._client = client
        #: The opaque permit id.
        self.id: str = permit_id
        #: Each limit's state at the grant.
        self.limits: list[LimitStatus] = limits
        #: Units granted of every limit not in ``costs``.
        self.cost: int = cost
        #: Units granted by limit name, where they differ from ``cost``.
        self.costs: dict[str, int] = dict(costs or {})
        #: Units to commit on a clean exit from the ``with`` block (a number, or units by
        #: limit name); ``None`` means all.
        self.used: Used | None = None
        #: When the grant's answer arrived (``time.monotonic()``), to measure the delay until
        #: the call it pays for is sent.
        self.granted_at: float = time.monotonic()
        self._settled = False

    def __repr__(self) -> str:
        return f"Permit(id={self.id!r}, cost={self.cost}, limits={self.limits!r})"

    @property
    def fence(self) -> int | None:
        """The fencing number of the permit's lease, or ``None`` if it holds no lease."""
        return next((status.fence for status in self.limits if status.fence is not None), None)

    @property
    def settled(self) -> bool:
        """Whether the permit was committed or released (or that was attempted)."""
        return self._settled

    def commit(self, used: Used | None = None, *, sent_after: float | None = None) -> Committed:
        """Say ``used`` units were used (default: ``self.used``, else all that was granted).

        A number counts for every rate limit of the permit; a mapping gives each rate limit's
        own by name (for a permit granted with ``costs``), and must name every rate limit of
        the permit and nothing else (a lease is released whether named or not).

        ``sent_after`` is the seconds from the grant to the call leaving for the vendor (at
        most an hour): the server widens the limit's margin to cover such delays, so that
        calls granted in one period do not reach the vendor crowded into one of its windows.

        The rest of the rate units are refunded and leases released. Once per permit: a second
        commit raises :class:`Conflict`.
        """
        if used is None:
            used = self.used if self.used is not None else self._all()
        wire = commit_body(used, sent_after)
        self._settled = True
        body = self._client._post(permit_path(self.id, "commit"), wire)
        return Committed(
            refunded=int(body.get("refunded", 0)), released=int(body.get("released", 0))
        )

    def release(self) -> Committed:
        """End the permit's leases; its rate units stay used."""
        return self.commit(self._all())

    def _all(self) -> Used:
        return all_units(self.limits, self.cost, self.costs)

    def renew(self) -> float:
        """Extend every lease of the permit by its TTL; returns seconds until the earliest
        expires. Raises :class:`Conflict` for a rate-only permit or a lease already gone."""
        body = self._client._post(permit_path(self.id, "renew"), {})
        return float(body.get("expires_ms", 0)) / 1000.0

    def _finish(self, failed: bool) -> None:
        """Settle on leaving a ``with`` block (or a decorated call)."""
        if self._settled:
            return
        if not failed:
            self.commit()
            return
        self._settled = True
        if self.fence is None:
            return
        try:
            self.release()
        except TollgateError as error:
            # The block's own exception matters more; the lease runs to its TTL.
            logger.warning("could not release the lease of permit %s: %s", self.id, error)

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._finish(failed=exc_type is not None)


class LimitsAdmin:
    """The admin API (``client.limits``): put, get, list and delete limits.

    Fields use the server's names: ``kind`` (``rate`` or ``concurrency``), ``limit``,
    ``period_ms``, ``algorithm``, ``burst``, ``margin_ms``, ``lease_ttl_ms``, ``reserve``,
    ``per``, ``match``. Calls use ``admin_token`` (or else ``token``).
    """

    def __init__(self, client: Client):
        self._client = client

    def put(
        self, name: str, rule: Mapping[str, Any] | None = None, /, **fields: Any
    ) -> dict[str, Any]:
        """Create or replace limit ``name``; returns it as stored, defaults filled in.

        Give the fields as keywords, as a mapping (``get``'s answer can be sent back), or both.
        """
        return self._client._request("PUT", limit_path(name), rule_body(rule, fields), admin=True)

    def get(self, name: str) -> dict[str, Any]:
        """Limit ``name`` as stored; :class:`NotFound` if there is none."""
        return self._client._request("GET", limit_path(name), None, admin=True)

    def list(self) -> LimitList:
        """Every limit in force (a list of dicts, with ``version`` and ``rejected``)."""
        body = self._client._request("GET", "/v1/limits", None, admin=True)
        return LimitList(
            body.get("limits", []),
            version=int(body.get("version", 0)),
            rejected=body.get("rejected", []),
        )

    def delete(self, name: str) -> None:
        """Remove limit ``name``; :class:`NotFound` if there is none."""
        self._client._request("DELETE", limit_path(name), None, admin=True)


class Client:
    """A blocking client of a Tollgate server. Thread-safe; use one per process.

    ``url`` is the server's; when none is given, ``TOLLGATE_SERVER``, else
    ``http://127.0.0.1:7070``. ``token`` is the data plane's bearer token and, unless
    ``admin_token`` is given, the admin API's too. Each is read in this order, the first found
    winning, as the ``tollgate`` commands read them:

    - the data plane: ``token``, else ``TOLLGATE_DATA_TOKEN`` (read when the client is made),
      else none (a server with no data token set needs none);
    - the admin API: ``admin_token``, else ``token``, else ``TOLLGATE_ADMIN_TOKEN``, else the
      token a local server keeps for this user, sent to that server alone once it has proved
      it holds it. ``TOLLGATE_DATA_TOKEN`` is never sent to the admin API.

    ``timeout`` bounds each call in seconds, a waiting acquire getting its wait on top.
    ``transport`` replaces httpx's (for tests, or a custom network setup).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        admin_token: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._options = Options.made(url, token, admin_token, timeout)
        self._http = httpx.Client(base_url=self._options.url, timeout=timeout, transport=transport)
        #: The admin API.
        self.limits = LimitsAdmin(self)

    @property
    def url(self) -> str:
        return self._options.url

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- requests --------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        admin: bool = False,
        wait: float = 0.0,
    ) -> httpx.Response:
        url, headers = path, self._options.headers(admin)
        kept = self._options.kept() if admin else None
        if kept is not None and self._proved(kept):
            url, headers = kept.base + path, bearer(kept.token)
        try:
            return self._http.request(
                method,
                url,
                json=body,
                headers=headers,
                timeout=self._options.timeout_for(wait),
            )
        except httpx.TransportError as error:
            raise unreachable(error, self._options.url) from error

    def _proved(self, kept: KeptToken) -> bool:
        """Whether the server at the address ``kept`` records proves it holds that token:
        asked with a fresh nonce before every call that would send it, with no token sent."""
        nonce = proof_nonce()
        try:
            answer = self._http.get(kept.proof_url(nonce), timeout=self._options.timeout)
        except httpx.TransportError as error:
            proof_failed(kept, f"no answer: {error or type(error).__name__}")
            return False
        if answer.status_code != 200:
            proof_failed(kept, f"it answered {answer.status_code}")
            return False
        try:
            proof = answer.json()
        except ValueError:
            proof = None
        if not kept.proved_by(nonce, proof):
            proof_failed(kept, "its proof does not match")
            return False
        return True

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        admin: bool = False,
    ) -> dict[str, Any]:
        return decode_object(self._send(method, path, body, admin=admin))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", path, body)

    # ---- data plane ------------------------------------------------------------------------

    def acquire(
        self,
        limits: Limits,
        *,
        key: str | None = None,
        cost: int = 1,
        priority: str = "normal",
        wait: float | None = None,
        costs: Costs | None = None,
    ) -> Permit:
        """Take ``cost`` units of every limit named (all or none), waiting up to ``wait``
        seconds for room (``None`` or 0: answer at once).

        ``costs`` gives the units of some limits by name where they differ from ``cost``, each
        name among ``limits``: one decision, all or none, e.g. ``acquire(["rpm", "itpm",
        "otpm"], costs={"itpm": 812, "otpm": 1000})``. ``key`` picks the counter of limits
        counted per key; ``priority`` is ``high``, ``normal`` or ``low``. Raises
        :class:`RateLimited` when nothing was granted in time.
        """
        args = acquire_body(limits, key=key, cost=cost, priority=priority, wait=wait, costs=costs)
        asked = time.monotonic()
        response = self._send("POST", "/v1/acquire", args.body, wait=args.wait)
        permit = self._permit(decode_object(response), cost, costs)
        permit.granted_at = granted_at(asked, response)
        return permit

    def try_acquire(
        self,
        limits: Limits,
        *,
        key: str | None = None,
        cost: int = 1,
        priority: str = "normal",
        wait: float | None = None,
        costs: Costs | None = None,
    ) -> Permit | None:
        """Like :meth:`acquire`, but ``None`` instead of raising :class:`RateLimited`."""
        try:
            return self.acquire(
                limits, key=key, cost=cost, priority=priority, wait=wait, costs=costs
            )
        except RateLimited:
            return None

    def _permit(self, body: dict[str, Any], cost: int, costs: Costs | None) -> Permit:
        permit_id = body.get("permit")
        if not isinstance(permit_id, str):
            raise ServerError("the grant carries no permit id")
        return Permit(self, permit_id, parse_limits(body.get("limits")), cost, costs)

    def charge(
        self,
        limits: Limits,
        *,
        cost: int | None = None,
        costs: Costs | None = None,
        key: str | None = None,
    ) -> list[Charged]:
        """Count units spent beyond any grant (``POST /v1/charge``): what a vendor counted over
        a permit's cost, say a model's answer longer than its estimate.

        Counted on each rate limit named at once, even past the limit (at most one capacity
        past it), so that every later acquire in the fleet waits the debt out; never denied.
        ``cost`` (default 1) is charged to every limit not in ``costs``. A concurrency limit
        is a :class:`BadRequest` on ``limits``. Returns each limit's :class:`Charged`.
        """
        body = self._post("/v1/charge", charge_body(limits, cost=cost, costs=costs, key=key))
        return parse_charged(body.get("limits"))

    def pause(self, limit: str, seconds: float, key: str | None = None) -> float:
        """Grant nothing on ``limit`` (or only its counter for ``key``) for ``seconds``,
        fleet-wide. Pauses only extend: returns the seconds until the pause in force ends."""
        body = self._post("/v1/pause", pause_body(limit, seconds, key))
        return float(body.get("paused_ms", 0)) / 1000.0

    def learn(
        self,
        limit: str,
        *,
        source: str,
        quotas: Sequence[Quota | tuple[int, float | None] | int] = (),
        remaining: int | None = None,
        reset: float | None = None,
        rate_limited: bool = False,
    ) -> LearnResult:
        """Teach the server what a vendor said of its limits, for rate limit ``limit``.

        ``source`` says where it was read (printable ASCII, at most 128 bytes). ``quotas``
        are the vendor's advertised quotas (:class:`Quota`, ``(quota, window_seconds)`` or a
        bare count); the server holds the least of them, converted to the limit's period,
        between a floor and the configured limit, for a while. ``remaining`` 0 with ``reset``
        seconds pauses the limit fleet-wide for that long. ``rate_limited`` says the vendor
        refused a call without advertising a quota: the server lowers the limit.

        Needs the admin token or a data token with ``may_pause`` whose scope covers the limit.
        """
        wire = learn_body(
            limit,
            source=source,
            quotas=quotas,
            remaining=remaining,
            reset=reset,
            rate_limited=rate_limited,
        )
        return self._learn(wire)

    def _learn(self, body: dict[str, Any]) -> LearnResult:
        return learn_result(self._post("/v1/learn", body))

    def check(self, user: str | None, method: str, path: str) -> CheckResult[Permit]:
        """May ``user`` make the inbound request ``method path`` now?

        Applies every limit whose ``match`` fits, all or none. A denial is ``allowed ==
        False`` (with ``retry_after``), not an exception. When a concurrency limit applied, the
        result's ``permit`` holds the lease: commit it (or use it as a context manager) when
        the request is done.
        """
        request: dict[str, Any] = {"method": method, "path": path}
        if user is not None:
            request["user"] = user
        response = self._send("POST", "/v1/check", request)
        return check_result(response, lambda permit_id, limits: Permit(self, permit_id, limits, 1))

    # ---- decorator -------------------------------------------------------------------------

    def limited(
        self,
        limits: Limits,
        *,
        key: str | None = None,
        cost: int = 1,
        priority: str = "normal",
        wait: float | None = None,
    ) -> Callable[[F], F]:
        """Decorate a function (plain or ``async def``) to run under a permit.

        Each call acquires first (raising :class:`RateLimited` on a denial, before the
        function runs), holds the permit while the function runs, and settles it as a ``with``
        block would. For a coroutine function the blocking calls run in a worker thread.
        """
        acquire_body(limits, key=key, cost=cost, priority=priority, wait=wait)  # check now

        def acquire() -> Permit:
            return self.acquire(limits, key=key, cost=cost, priority=priority, wait=wait)

        def decorate(function: F) -> F:
            if inspect.iscoroutinefunction(function):

                @functools.wraps(function)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    permit = await asyncio.to_thread(acquire)
                    try:
                        result = await function(*args, **kwargs)
                    except BaseException:
                        await asyncio.to_thread(permit._finish, True)
                        raise
                    await asyncio.to_thread(permit._finish, False)
                    return result

                return cast(F, run_async)

            @functools.wraps(function)
            def run(*args: Any, **kwargs: Any) -> Any:
                with acquire():
                    return function(*args, **kwargs)

            return cast(F, run)

        return decorate


PermitT = TypeVar("PermitT")


def check_result(
    response: httpx.Response, make_permit: Callable[[str, list[LimitStatus]], PermitT]
) -> CheckResult[PermitT]:
    """A ``/v1/check`` answer: 200 allowed, 429 denied (a result, not an error)."""
    if response.status_code == 429:
        error = error_from_response(response)
        try:
            body = response.json()
        except ValueError:
            raise error from None
        if not isinstance(error, RateLimited) or not isinstance(body, dict):
            raise error
        _, path, matched, limits, _ = check_answer(body)
        return CheckResult(
            allowed=False,
            path=path,
            matched=matched,
            limits=limits,
            retry_after=error.retry_after,
            reason=error.reason,
        )
    allowed, path, matched, limits, permit_id = check_answer(decode_object(response))
    return CheckResult(
        allowed=allowed,
        path=path,
        matched=matched,
        limits=limits,
        permit=make_permit(permit_id, limits) if permit_id is not None else None,
    )
