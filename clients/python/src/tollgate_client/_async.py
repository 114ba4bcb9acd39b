"""The asyncio client: :class:`AsyncClient`, its :class:`AsyncPermit` and its admin API."""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Generator, Mapping, Sequence
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
from ._errors import RateLimited, ServerError, TollgateError
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
    commit_body,
    learn_body,
    learn_result,
    parse_charged,
    parse_limits,
    pause_body,
    rule_body,
)
from ._sync import Client, check_result

F = TypeVar("F", bound=Callable[..., Any])


class AsyncPermit:
    """What an acquire granted; the asyncio twin of :class:`Permit`.

    Used as an async context manager, a clean exit commits ``used`` units (all that was
    granted unless ``used`` was set in the block) and releases any lease. An exception commits
    nothing: the rate units stay spent and any lease is released. After an explicit
    :meth:`commit` or :meth:`release`, leaving the block does nothing more.
    """

    def __init__(
        self,
        client: AsyncClient,
        permit_id: str,
        limits: list[LimitStatus],
        cost: int,
        costs: Costs | None = None,
    ) -> None:
        self._client = client
        #: The opaque permit id.
        self.id: str = permit_id
        #: Each limit's state at the grant.
        self.limits: list[LimitStatus] = limits
        #: Units granted of every limit not in ``costs``.
        self.cost: int = cost
        #: Units granted by limit name, where they differ from ``cost``.
        self.costs: dict[str, int] = dict(costs or {})
        #: Units to commit on a clean exit from the ``async with`` block (a number, or units
        #: by limit name); ``None`` means all.
        self.used: Used | None = None
        #: When the grant's answer arrived (``time.monotonic()``).
        self.granted_at: float = time.monotonic()
        self._settled = False

    def __repr__(self) -> str:
        return f"AsyncPermit(id={self.id!r}, cost={self.cost}, limits={self.limits!r})"

    @property
    def fence(self) -> int | None:
        """The fencing number of the permit's lease, or ``None`` if it holds no lease."""
        return next((status.fence for status in self.limits if status.fence is not None), None)

    @property
    def settled(self) -> bool:
        """Whether the permit was committed or released (or that was attempted)."""
        return self._settled

    async def commit(
        self, used: Used | None = None, *, sent_after: float | None = None
    ) -> Committed:
        """Say ``used`` units were used (default: ``self.used``, else all that was granted): a
        number for every rate limit, or units by limit name; ``used`` and ``sent_after`` as for
        :meth:`Permit.commit`.

        The rest of the rate units are refunded and leases released. Once per permit: a second
        commit raises :class:`Conflict`.
        """
        if used is None:
            used = self.used if self.used is not None else self._all()
        wire = commit_body(used, sent_after)
        self._settled = True
        body = await self._client._post(permit_path(self.id, "commit"), wire)
        return Committed(
            refunded=int(body.get("refunded", 0)), released=int(body.get("released", 0))
        )

    async def release(self) -> Committed:
        """End the permit's leases; its rate units stay used."""
        return await self.commit(self._all())

    def _all(self) -> Used:
        return all_units(self.limits, self.cost, self.costs)

    async def renew(self) -> float:
        """Extend every lease of the permit by its TTL; returns seconds until the earliest
        expires. Raises :class:`Conflict` for a rate-only permit or a lease already gone."""
        body = await self._client._post(permit_path(self.id, "renew"), {})
        return float(body.get("expires_ms", 0)) / 1000.0

    async def _finish(self, failed: bool) -> None:
        """Settle on leaving an ``async with`` block (or a decorated call)."""
        if self._settled:
            return
        if not failed:
            await self.commit()
            return
        self._settled = True
        if self.fence is None:
            return
        try:
            await self.release()
        except TollgateError as error:
            # The block's own exception matters more; the lease runs to its TTL.
            logger.warning("could not release the lease of permit %s: %s", self.id, error)

    async def __aenter__(self) -> AsyncPermit:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._finish(failed=exc_type is not None)


class AcquireCall:
    """An acquire not yet sent: ``await`` it for the permit, or use it directly in ``async
    with`` (the permit is settled when the block ends)."""

    def __init__(self, acquire: Callable[[], Awaitable[AsyncPermit]]) -> None:
        self._acquire = acquire
        self._permit: AsyncPermit | None = None

    def __await__(self) -> Generator[Any, None, AsyncPermit]:
        return self._acquire().__await__()

    async def __aenter__(self) -> AsyncPermit:
        self._permit = await self._acquire()
        return self._permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._permit is not None:
            await self._permit.__aexit__(exc_type, exc, tb)


class AsyncLimitsAdmin:
    """The admin API (``client.limits``), awaitable: put, get, list and delete limits.

    Fields use the server's names: ``kind`` (``rate`` or ``concurrency``), ``limit``,
    ``period_ms``, ``algorithm``, ``burst``, ``margin_ms``, ``lease_ttl_ms``, ``reserve``,
    ``per``, ``match``. Calls use ``admin_token`` (or else ``token``).
    """

    def __init__(self, client: AsyncClient):
        self._client = client

    async def put(
        self, name: str, rule: Mapping[str, Any] | None = None, /, **fields: Any
    ) -> dict[str, Any]:
        """Create or replace limit ``name``; returns it as stored, defaults filled in.

        Give the fields as keywords, as a mapping (``get``'s answer can be sent back), or both.
        """
        return await self._client._request(
            "PUT", limit_path(name), rule_body(rule, fields), admin=True
        )

    async def get(self, name: str) -> dict[str, Any]:
        """Limit ``name`` as stored; :class:`NotFound` if there is none."""
        return await self._client._request("GET", limit_path(name), None, admin=True)

    async def list(self) -> LimitList:
        """Every limit in force (a list of dicts, with ``version`` and ``rejected``)."""
        body = await self._client._request("GET", "/v1/limits", None, admin=True)
        return LimitList(
            body.get("limits", []),
            version=int(body.get("version", 0)),
            rejected=body.get("rejected", []),
        )

    async def delete(self, name: str) -> None:
        """Remove limit ``name``; :class:`NotFound` if there is none."""
        await self._client._request("DELETE", limit_path(name), None, admin=True)


class AsyncClient:
    """An asyncio client of a Tollgate server; the twin of :class:`Client`, and made with the
    same arguments, read the same way (see :class:`Client`).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        admin_token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._options = Options.made(url, token, admin_token, timeout)
        self._http = httpx.AsyncClient(
            base_url=self._options.url, timeout=timeout, transport=transport
        )
        #: The admin API.
        self.limits = AsyncLimitsAdmin(self)
        # A blocking twin for plain functions decorated with `limited`, made on first use.
        self._blocking: Client | None = None
        self._blocking_lock = threading.Lock()

    @property
    def url(self) -> str:
        return self._options.url

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()
        if self._blocking is not None:
            self._blocking.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ---- requests --------------------------------------------------------------------------

    async def _send(
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
        if kept is not None and await self._proved(kept):
            url, headers = kept.base + path, bearer(kept.token)
        try:
            return await self._http.request(
                method,
                url,
                json=body,
                headers=headers,
                timeout=self._options.timeout_for(wait),
            )
        except httpx.TransportError as error:
            raise unreachable(error, self._options.url) from error

    async def _proved(self, kept: KeptToken) -> bool:
        """Whether the server at the address ``kept`` records proves it holds that token:
        asked with a fresh nonce before every call that would send it, with no token sent."""
        nonce = proof_nonce()
        try:
            answer = await self._http.get(kept.proof_url(nonce), timeout=self._options.timeout)
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

    async def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        admin: bool = False,
    ) -> dict[str, Any]:
        return decode_object(await self._send(method, path, body, admin=admin))

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request("POST", path, body)

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
    ) -> AcquireCall:
        """Take ``cost`` units of every limit named (all or none), waiting up to ``wait``
        seconds for room (``None`` or 0: answer at once); ``costs`` the units of some limits by
        name where they differ from ``cost`` (see :meth:`Client.acquire`).

        Use as ``async with client.acquire(...) as permit:`` or ``permit = await
        client.acquire(...)``. ``key`` picks the counter of limits counted per key;
        ``priority`` is ``high``, ``normal`` or ``low``. Raises :class:`RateLimited` when
        nothing was granted in time.
        """
        args = acquire_body(limits, key=key, cost=cost, priority=priority, wait=wait, costs=costs)

        async def send() -> AsyncPermit:
            asked = time.monotonic()
            response = await self._send("POST", "/v1/acquire", args.body, wait=args.wait)
            body = decode_object(response)
            permit_id = body.get("permit")
            if not isinstance(permit_id, str):
                raise ServerError("the grant carries no permit id", status=response.status_code)
            permit = AsyncPermit(self, permit_id, parse_limits(body.get("limits")), cost, costs)
            permit.granted_at = granted_at(asked, response)
            return permit

        return AcquireCall(send)

    async def try_acquire(
        self,
        limits: Limits,
        *,
        key: str | None = None,
        cost: int = 1,
        priority: str = "normal",
        wait: float | None = None,
        costs: Costs | None = None,
    ) -> AsyncPermit | None:
        """Like :meth:`acquire`, but ``None`` instead of raising :class:`RateLimited`."""
        try:
            return await self.acquire(
                limits, key=key, cost=cost, priority=priority, wait=wait, costs=costs
            )
        except RateLimited:
            return None

    async def charge(
        self,
        limits: Limits,
        *,
        cost: int | None = None,
        costs: Costs | None = None,
        key: str | None = None,
    ) -> list[Charged]:
        """Count units spent beyond any grant, even past the limit (see :meth:`Client.charge`)."""
        body = await self._post("/v1/charge", charge_body(limits, cost=cost, costs=costs, key=key))
        return parse_charged(body.get("limits"))

    async def pause(self, limit: str, seconds: float, key: str | None = None) -> float:
        """Grant nothing on ``limit`` (or only its counter for ``key``) for ``seconds``,
        fleet-wide. Pauses only extend: returns the seconds until the pause in force ends."""
        body = await self._post("/v1/pause", pause_body(limit, seconds, key))
        return float(body.get("paused_ms", 0)) / 1000.0

    async def learn(
        self,
        limit: str,
        *,
        source: str,
        quotas: Sequence[Quota | tuple[int, float | None] | int] = (),
        remaining: int | None = None,
        reset: float | None = None,
        rate_limited: bool = False,
    ) -> LearnResult:
        """Teach the server what a vendor said of its limits (see :meth:`Client.learn`)."""
        wire = learn_body(
            limit,
            source=source,
            quotas=quotas,
            remaining=remaining,
            reset=reset,
            rate_limited=rate_limited,
        )
        return await self._learn(wire)

    async def _learn(self, body: dict[str, Any]) -> LearnResult:
        return learn_result(await self._post("/v1/learn", body))

    async def check(self, user: str | None, method: str, path: str) -> CheckResult[AsyncPermit]:
        """May ``user`` make the inbound request ``method path`` now?

        Applies every limit whose ``match`` fits, all or none. A denial is ``allowed ==
        False`` (with ``retry_after``), not an exception. When a concurrency limit applied, the
        result's ``permit`` holds the lease: commit it (or use it as a context manager) when
        the request is done.
        """
        request: dict[str, Any] = {"method": method, "path": path}
        if user is not None:
            request["user"] = user
        response = await self._send("POST", "/v1/check", request)
        return check_result(
            response, lambda permit_id, limits: AsyncPermit(self, permit_id, limits, 1)
        )

    # ---- decorator -------------------------------------------------------------------------

    def _blocking_client(self) -> Client:
        with self._blocking_lock:
            if self._blocking is None:
                options = self._options
                self._blocking = Client(
                    options.url,
                    options.token,
                    options.timeout,
                    admin_token=options.admin_token,
                )
                # The same settings, not the environment read again.
                self._blocking._options = options
            return self._blocking

    def limited(
        self,
        limits: Limits,
        *,
        key: str | None = None,
        cost: int = 1,
        priority: str = "normal",
        wait: float | None = None,
    ) -> Callable[[F], F]:
        """Decorate a function (``async def`` or plain) to run under a permit.

        Each call acquires first (raising :class:`RateLimited` on a denial, before the
        function runs), holds the permit while the function runs, and settles it as a ``with``
        block would. A plain function cannot await, so it takes its permits through a blocking
        twin of this client (same URL, tokens and timeout).
        """
        acquire_body(limits, key=key, cost=cost, priority=priority, wait=wait)  # check now

        def decorate(function: F) -> F:
            if inspect.iscoroutinefunction(function):

                @functools.wraps(function)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    async with self.acquire(
                        limits, key=key, cost=cost, priority=priority, wait=wait
                    ):
                        return await function(*args, **kwargs)

                return cast(F, run_async)

            @functools.wraps(function)
            def run(*args: Any, **kwargs: Any) -> Any:
                client = self._blocking_client()
                with client.acquire(limits, key=key, cost=cost, priority=priority, wait=wait):
                    return function(*args, **kwargs)

            return cast(F, run)

        return decorate
