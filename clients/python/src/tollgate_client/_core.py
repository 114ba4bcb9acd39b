"""What the sync and async clients share: configuration, headers, answer decoding."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from ._errors import ServerError, ServerUnreachable, TollgateError, error_from_response
from ._kept import KeptToken, given_admin_token, kept_admin_token

#: Where ``tollgate serve`` listens by default: the URL of a client given none and no
#: ``TOLLGATE_SERVER``.
DEFAULT_URL = "http://127.0.0.1:7070"
#: Seconds one call may take; a waiting acquire gets its wait on top.
DEFAULT_TIMEOUT = 10.0

logger = logging.getLogger("tollgate_client")


def server_url(url: str | None) -> str:
    """The server a client talks to: ``url`` given, else ``TOLLGATE_SERVER`` (as the
    ``tollgate`` commands read it), else :data:`DEFAULT_URL`."""
    return (url or os.environ.get("TOLLGATE_SERVER") or DEFAULT_URL).rstrip("/")


@dataclass(frozen=True)
class Options:
    """A client's settings, kept so that a companion client can be made with the same."""

    url: str
    #: The token given, for the data plane and, with no ``admin_token``, the admin API.
    token: str | None
    admin_token: str | None
    timeout: float
    #: ``TOLLGATE_DATA_TOKEN`` when the client was made with no token; for the data plane
    #: alone, since a data token opens no admin call.
    data_token_from_environment: str | None = None

    @staticmethod
    def made(
        url: str | None, token: str | None, admin_token: str | None, timeout: float
    ) -> Options:
        """The settings of a client made with these arguments, the environment filling in
        those not given."""
        from_environment = None if token else os.environ.get("TOLLGATE_DATA_TOKEN") or None
        return Options(
            url=server_url(url),
            token=token,
            admin_token=admin_token,
            timeout=timeout,
            data_token_from_environment=from_environment,
        )

    def headers(self, admin: bool) -> dict[str, str]:
        """The bearer header for the data plane or, with ``admin``, the admin API. The data
        plane: the token given, else ``TOLLGATE_DATA_TOKEN``. The admin API: the admin token
        given, else the data token given, else ``TOLLGATE_ADMIN_TOKEN``. A token a local
        server keeps is not among them: it is sent only once proved (:meth:`kept`)."""
        if not admin:
            return bearer(self.token or self.data_token_from_environment)
        return bearer(self.admin_token or self.token or given_admin_token())

    def kept(self) -> KeptToken | None:
        """For an admin call with no token given: the token a local server keeps for this user
        that belongs to ``url``, to be proved before it is sent."""
        if self.admin_token or self.token or given_admin_token():
            return None
        return kept_admin_token(self.url)

    def timeout_for(self, wait: float) -> httpx.Timeout:
        """The HTTP timeout of a call that may wait ``wait`` seconds at the server."""
        return httpx.Timeout(self.timeout + wait)


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def proof_failed(kept: KeptToken, why: str) -> None:
    """Say why a kept token is not sent; the call goes on without it."""
    logger.warning("%s", kept.refusal(why))


def permit_path(permit_id: str, action: str) -> str:
    return f"/v1/permits/{quote(permit_id, safe='')}/{action}"


def limit_path(name: str) -> str:
    return f"/v1/limits/{quote(name, safe='')}"


def unreachable(error: httpx.TransportError, url: str) -> TollgateError:
    """A failure with no answer from the server."""
    detail = str(error) or type(error).__name__
    return ServerUnreachable(f"no answer from the Tollgate server at {url}: {detail}")


def decode(response: httpx.Response) -> Any:
    """The JSON of a success, or the error an error answer stands for."""
    if response.status_code >= 400:
        raise error_from_response(response)
    try:
        return response.json()
    except ValueError as error:
        raise ServerError(
            f"HTTP {response.status_code} with a body that is not JSON",
            status=response.status_code,
        ) from error


def decode_object(response: httpx.Response) -> dict[str, Any]:
    """Like :func:`decode`, for answers that must be a JSON object."""
    body = decode(response)
    if not isinstance(body, dict):
        raise ServerError(
            f"HTTP {response.status_code} with a body that is not a JSON object",
            status=response.status_code,
        )
    return body


def server_held(value: str | None) -> float | None:
    """How long a Tollgate server held an acquire, in seconds, from its
    ``Server-Timing: acquire;dur=MS``; ``None`` when it says nothing readable."""
    if value is None:
        return None
    for metric in value.split(","):
        name, *parameters = (part.strip() for part in metric.split(";"))
        if name != "acquire":
            continue
        for parameter in parameters:
            if not parameter.startswith("dur="):
                continue
            try:
                ms = float(parameter[4:])
            except ValueError:
                return None
            if ms == ms and 0.0 <= ms <= 86_400_000.0:
                return ms / 1000.0
            return None
    return None


def granted_at(asked: float, response: httpx.Response) -> float:
    """When the server made the grant of ``response``, on this process's monotonic clock: the
    request's departure plus the time the server held it, so that the answer's way back counts
    in the delay until the call is sent; its arrival when the server says nothing."""
    now = time.monotonic()
    held = server_held(response.headers.get("server-timing"))
    return now if held is None else min(asked + held, now)
