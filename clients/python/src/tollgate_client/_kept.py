"""The admin token a local ``tollgate serve`` makes when none is configured, as the ``tollgate``
commands find it: ``TOLLGATE_ADMIN_TOKEN``, else the copy the server keeps for its user at
``$XDG_STATE_HOME/tollgate/servers/PORT.admin-token`` (default ``~/.local/state``), refused when
others could have read or written it. A kept token is sent only to the server that wrote it: at
the address it recorded (never where a name such as ``localhost`` leads now), and only once the
server there has proved it holds it (``GET /v1/admin-token/proof``). The proof's constants are
the server's (``tollgate_server::admin_proof``), held alike by
``crates/cli/tests/vectors/kept_token.json``."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

#: The endpoint where a server proves it holds the admin token.
PROOF_PATH = "/v1/admin-token/proof"
#: Its query parameter for the nonce.
PROOF_NONCE_PARAMETER = "nonce"
#: What the proof's key is derived under.
PROOF_LABEL = "tollgate admin-token proof v1"


def user_copy_path(port: int) -> Path | None:
    """Where the server listening on ``port`` keeps its token for this user's programs."""
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):
        home = os.environ.get("HOME", "")
        if not os.path.isabs(home):
            return None
        state = os.path.join(home, ".local", "state")
    return Path(state) / "tollgate" / "servers" / f"{port}.admin-token"


def _belongs_to(listen: str, host: str, port: int) -> bool:
    """Whether a server listening on ``listen`` (``ADDRESS:PORT``) is the one at host:port."""
    address, _, listen_port = listen.rpartition(":")
    address = address.strip("[]")
    if not listen_port.isdigit() or int(listen_port) != port:
        return False
    try:
        bound = ipaddress.ip_address(address)
    except ValueError:
        return False
    if host.lower() == "localhost":
        return bound.is_loopback or bound.is_unspecified
    try:
        asked = ipaddress.ip_address(host)
    except ValueError:
        return False
    return asked == bound or (asked.is_loopback and bound.is_unspecified)


def _host_port(url: str) -> tuple[str, int] | None:
    """``http(s)://HOST:PORT/...`` as (host, port); the port defaults to the scheme's."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or parts.hostname is None:
        return None
    return parts.hostname, port or (443 if scheme == "https" else 80)


def belongs_to(listen: str | None, url: str) -> bool:
    """Whether a token whose server listens on ``listen`` may be sent to ``url``: only to that
    server, at its own port over loopback or at the exact address it listens on."""
    host_port = _host_port(url)
    if listen is None or host_port is None:
        return False
    return _belongs_to(listen, *host_port)


def proof(token: str, listen: str, nonce: str) -> str:
    """The proof, in hex, that the holder of ``token`` listening on ``listen`` answers to
    ``nonce``: HMAC-SHA256 of ``listen``, a newline and ``nonce``, keyed by HMAC-SHA256 of the
    label keyed by the token."""
    key = hmac.new(token.encode(), PROOF_LABEL.encode(), hashlib.sha256).digest()
    return hmac.new(key, f"{listen}\n{nonce}".encode(), hashlib.sha256).hexdigest()


def proof_nonce() -> str:
    """A fresh nonce: 32 random bytes in hex."""
    return secrets.token_hex(32)


def proved(token: str, listen: str, nonce: str, answer: Any) -> bool:
    """Whether ``answer`` (the proof endpoint's JSON) proves ``token`` for ``listen`` and
    ``nonce``, compared in constant time."""
    given = answer.get("proof") if isinstance(answer, dict) else None
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode(), proof(token, listen, nonce).encode())


def connect_address(listen: str) -> str | None:
    """Where to reach the server that recorded ``listen``: that address as written, loopback
    for one bound to all addresses."""
    address, _, port = listen.rpartition(":")
    try:
        bound = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return None
    if not port.isdigit():
        return None
    if bound.is_unspecified:
        bound = ipaddress.ip_address("::1" if bound.version == 6 else "127.0.0.1")
    host = f"[{bound}]" if bound.version == 6 else str(bound)
    return f"{host}:{port}"


def base_for(listen: str | None, url: str) -> str | None:
    """``url`` with its host and port replaced by the address the server recorded, or ``None``
    when the token does not belong to ``url``."""
    if listen is None or not belongs_to(listen, url):
        return None
    connect = connect_address(listen)
    scheme, _, rest = url.partition("://")
    if connect is None:
        return None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return f"{scheme}://{connect}{rest[end:]}"


@dataclass(frozen=True)
class KeptToken:
    """A kept token that belongs to a URL: where it was read, and where to send it."""

    token: str
    listen: str
    path: Path
    #: The URL to send it to: the asked one with the recorded address in place of its host.
    base: str

    def proof_url(self, nonce: str) -> str:
        return f"{self.base}{PROOF_PATH}?{PROOF_NONCE_PARAMETER}={nonce}"

    def proved_by(self, nonce: str, answer: Any) -> bool:
        return proved(self.token, self.listen, nonce, answer)

    def refusal(self, why: str) -> str:
        """What a client says when it does not send this token."""
        return (
            f"not sending the admin token kept in {self.path}: the server at {self.base} did not "
            f"prove that it holds it ({why}); the file may be left by a server that has stopped, "
            "and another program may listen on its port"
        )


def given_admin_token() -> str | None:
    """``TOLLGATE_ADMIN_TOKEN``, sent wherever the client is told."""
    return os.environ.get("TOLLGATE_ADMIN_TOKEN") or None


def kept_admin_token(url: str) -> KeptToken | None:
    """The token a local server keeps for this user that belongs to the server at ``url``, as
    the ``tollgate`` commands find it; the caller must have it proved before sending it."""
    host_port = _host_port(url)
    if host_port is None:
        return None
    path = user_copy_path(host_port[1])
    if path is None:
        return None
    try:
        info = path.stat()
        text = path.read_text()
    except FileNotFoundError:
        return None
    if stat.S_IMODE(info.st_mode) & 0o077 or info.st_uid != os.getuid():
        raise PermissionError(
            f"admin token file {path} could have been read or planted by another user "
            f"(mode {stat.S_IMODE(info.st_mode):o}, owner {info.st_uid}); make it 0600 and "
            "yours, or remove it"
        )
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    listens = [
        line.removeprefix("listen ").strip() for line in lines[1:] if line.startswith("listen ")
    ]
    if not listens:
        return None
    base = base_for(listens[-1], url)
    if base is None:
        return None
    return KeptToken(token=lines[0], listen=listens[-1], path=path, base=base)
