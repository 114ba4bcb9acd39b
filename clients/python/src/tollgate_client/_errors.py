"""The errors a Tollgate server answers with, one class per wire code.

Every error answer of the server is ``{"error": {"code", "message", "field"?}, ...}``. The code
picks the class; ``field`` names the request field at fault (for ``bad_request``). A denial
(``429 rate_limited``) also carries when to retry and the state of the limits.
"""

from __future__ import annotations

from typing import Any

import httpx

from ._models import LimitStatus, parse_limits

__all__ = [
    "BadRequest",
    "Conflict",
    "Forbidden",
    "NotFound",
    "RateLimited",
    "ServerError",
    "ServerUnreachable",
    "StoreUnavailable",
    "TollgateError",
    "TooManyKeys",
    "Unauthorized",
    "error_from_response",
]


class TollgateError(Exception):
    """A request to the Tollgate server failed.

    ``code`` is the server's wire code (``bad_request``, ``not_found``, ...), ``message`` its
    explanation, ``field`` the request field at fault when the server names one (else
    ``None``), and ``status`` the HTTP status (``None`` when no answer arrived).
    """

    #: The wire code this class stands for.
    default_code: str = "internal"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code: str = code if code is not None else self.default_code
        self.message: str = message
        self.field: str | None = field
        self.status: int | None = status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle as `cls(*args)`, which keyword-only fields do not survive; errors
        # must cross process boundaries whole (multiprocessing, task queues).
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"field={self.field!r}, status={self.status!r})"
        )


def _rebuild(cls: type[TollgateError], message: str, state: dict[str, Any]) -> TollgateError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class BadRequest(TollgateError):
    """The server refused the request as malformed; ``field`` names the field at fault."""

    default_code = "bad_request"


class Unauthorized(TollgateError):
    """The bearer token is missing or wrong (or the admin API is disabled on the server)."""

    default_code = "unauthorized"


class Forbidden(Unauthorized):
    """The token is valid but its scope does not allow this: a limit outside its limits, a
    priority above its ``priority_max``, or a pause it may not make. The message names which.

    A subclass of ``Unauthorized``, which servers before ``forbidden`` answered these with.
    """

    default_code = "forbidden"


class NotFound(TollgateError):
    """Unknown limit, unknown (or forged) permit, or unknown endpoint."""

    default_code = "not_found"


class RateLimited(TollgateError):
    """Not granted within the wait.

    ``retry_after`` is when to try again, in seconds; ``reason`` is ``capacity``, ``paused``,
    ``recovering`` or ``queued`` (``None`` if the answer did not say); ``limits`` holds the
    state of each limit asked for.
    """

    default_code = "rate_limited"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float,
        reason: str | None = None,
        limits: list[LimitStatus] | None = None,
        code: str | None = None,
        field: str | None = None,
        status: int | None = 429,
    ) -> None:
        super().__init__(message, code=code, field=field, status=status)
        self.retry_after: float = retry_after
        self.reason: str | None = reason
        self.limits: list[LimitStatus] = limits if limits is not None else []


class StoreUnavailable(TollgateError):
    """The server's store or rules database cannot be reached, or the server is stopping.

    Transient: the same request may succeed later or on another replica.
    """

    default_code = "store_unavailable"


class TooManyKeys(TollgateError):
    """The server tracks as many counters as it is configured to (``keys_tracked_max``)."""

    default_code = "too_many_keys"


class Conflict(TollgateError):
    """The permit was committed already or expired, or a rate permit was renewed."""

    default_code = "conflict"


class ServerError(TollgateError):
    """The server failed (code ``internal``), or answered something that is not Tollgate's."""

    default_code = "internal"


class ServerUnreachable(TollgateError):
    """No answer from the server: connection refused, reset, or timed out.

    Its code, ``unreachable``, is the client's own; the server never sends it. The httpx
    exception is the ``__cause__``.
    """

    default_code = "unreachable"


_BY_CODE: dict[str, type[TollgateError]] = {
    cls.default_code: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        RateLimited,
        StoreUnavailable,
        TooManyKeys,
        Conflict,
        ServerError,
    )
}

# An answer without Tollgate's error body (a proxy in front of the server, say) is classed by
# its status alone.
_BY_STATUS: dict[int, type[TollgateError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: BadRequest,
    409: Conflict,
    429: RateLimited,
    503: StoreUnavailable,
}


def _retry_after_header(response: httpx.Response) -> float:
    value = response.headers.get("retry-after", "").strip()
    return float(value) if value.isdigit() else 0.0


def error_from_response(response: httpx.Response) -> TollgateError:
    """The error an answer of status 400 or above stands for. Its body must have been read."""
    status = response.status_code
    body: Any
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("error") if isinstance(body, dict) else None
    code = detail.get("code") if isinstance(detail, dict) else None
    if not isinstance(detail, dict) or not isinstance(code, str):
        cls = _BY_STATUS.get(status, BadRequest if status < 500 else ServerError)
        text = response.text[:200].strip() or "(empty)"
        message = f"HTTP {status} without a Tollgate error body: {text}"
        if cls is RateLimited:
            return RateLimited(message, retry_after=_retry_after_header(response), status=status)
        return cls(message, status=status)
    raw_message = detail.get("message")
    message = raw_message if isinstance(raw_message, str) else f"HTTP {status}"
    raw_field = detail.get("field")
    field = raw_field if isinstance(raw_field, str) else None
    cls = _BY_CODE.get(code, ServerError if status >= 500 else TollgateError)
    if cls is RateLimited:
        assert isinstance(body, dict)
        retry_after_ms = body.get("retry_after_ms")
        retry_after = (
            retry_after_ms / 1000.0
            if isinstance(retry_after_ms, (int, float))
            else _retry_after_header(response)
        )
        reason = body.get("reason")
        return RateLimited(
            message,
            retry_after=retry_after,
            reason=reason if isinstance(reason, str) else None,
            limits=parse_limits(body.get("limits")),
            code=code,
            field=field,
            status=status,
        )
    return cls(message, code=code, field=field, status=status)
