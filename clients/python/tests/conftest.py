"""Fixtures: a real `tollgate serve` (from $TOLLGATE_BIN) on a free loopback port, shared by
the session, clients bound to it, a factory for servers with settings of their own, and one for
judging mock vendors (from $TOLLGATE_MOCK_VENDOR_BIN)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from _support import (
    ADMIN_TOKEN,
    MockVendorFactory,
    Server,
    ServerFactory,
    find_binary,
    find_mock_vendor_binary,
)
from tollgate_client import AsyncClient, Client


@pytest.fixture(scope="session", autouse=True)
def no_kept_admin_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The clients find their server and tokens in the environment and a local server's admin
    token in the user's state directory: none of them is the developer's during the tests."""
    read = ("TOLLGATE_ADMIN_TOKEN", "TOLLGATE_DATA_TOKEN", "TOLLGATE_SERVER", "XDG_STATE_HOME")
    saved = {name: os.environ.get(name) for name in read}
    for name in read:
        os.environ.pop(name, None)
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tollgate_bin() -> str:
    try:
        return find_binary()
    except RuntimeError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="session")
def servers(tollgate_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    factory = ServerFactory(tollgate_bin, Path(tmp_path_factory.mktemp("servers")))
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def mock_vendors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockVendorFactory]:
    """Judging mock vendors (`tollgate-mock-vendor`), each started by the test that needs it."""
    try:
        binary = find_mock_vendor_binary()
    except RuntimeError as error:
        pytest.fail(str(error), pytrace=False)
    factory = MockVendorFactory(binary, Path(tmp_path_factory.mktemp("vendors")))
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def server(servers: ServerFactory) -> Server:
    """The shared server: memory store, admin token set, data plane open."""
    return servers.start()


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url, token=ADMIN_TOKEN) as tollgate:
        yield tollgate


@pytest.fixture
async def async_client(server: Server) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.url, token=ADMIN_TOKEN) as tollgate:
        yield tollgate


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port
