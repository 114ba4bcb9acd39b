"""The admin token a local ``tollgate serve`` makes when none is configured, as the ``tollgate``
commands find it: ``TOLLGATE_ADMIN_TOKEN``, else the copy the server keeps for its user at
``$XDG_STATE_HOME/tollgate/servers/PORT.admin-token`` (default ``~/.local/state``), sent only to
the server that wrote it and refused when others could have read or written it."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path
from urllib.parse import urlsplit


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


def kept_admin_token(url: str) -> str | None:
    """The admin token for the server at ``url``, as the ``tollgate`` commands find it."""
    token = os.environ.get("TOLLGATE_ADMIN_TOKEN")
    if token:
        return token
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
    listens = [line.removeprefix("listen ") for line in lines[1:] if line.startswith("listen ")]
    if not listens or not belongs_to(listens[-1], url):
        return None
    return lines[0]
