"""Against the real binary: a kept admin token reaches no other program on its server's port,
neither one on the port of a server that has stopped (even one that passes the challenge on to
the real server elsewhere) nor one where ``localhost`` leads while the server listens on the
other loopback address. The stand-in writes down every header it is sent."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from _support import Server, ServerFactory
from tollgate_client import AsyncClient, Client, Unauthorized

PROOF_PATH: str = json.loads(
    (
        Path(__file__).resolve().parents[3]
        / "crates"
        / "cli"
        / "tests"
        / "vectors"
        / "kept_token.json"
    ).read_text()
)["proof"]["path"]


class StandIn:
    """Another user's program on a port this user's clients may reach: it writes down the
    headers of every request, and answers 401, or passes a proof request on to ``relay`` (the
    real server elsewhere, made to answer the challenge for it)."""

    def __init__(self, host: str, port: int, relay: str | None = None) -> None:
        self.heads: list[str] = []
        heads = self.heads

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.answer()

            def do_PUT(self) -> None:
                self.answer()

            def answer(self) -> None:
                heads.append(f"{self.command} {self.path}\n{self.headers}")
                length = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(length)
                if relay is not None and self.path.startswith(PROOF_PATH):
                    passed = httpx.get(f"{relay}{self.path}", timeout=30)
                    status, body = passed.status_code, passed.content
                else:
                    status, body = 401, b'{"error":{"code":"unauthorized","message":"no"}}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

        family = socket.AF_INET6 if ":" in host else socket.AF_INET

        class Listener(ThreadingHTTPServer):
            address_family = family

        self._server = Listener((host, port), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def assert_never_sent(self, token: str) -> None:
        for head in self.heads:
            assert token not in head, f"the kept token reached the stand-in:\n{head}"
            assert "authorization" not in head.lower(), f"credentials reached it:\n{head}"


def _kept_token_of(server: Server) -> str:
    return (server.directory / "rules.db.admin-token").read_text().splitlines()[0]


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_a_token_left_by_a_stopped_server_is_not_sent_to_whoever_listens_on_its_port(
    servers: ServerFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = str(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", state)
    first = servers.start(env={"TOLLGATE_ADMIN_TOKEN": None, "XDG_STATE_HOME": state})
    token, port = _kept_token_of(first), _port_of(first.url)
    # Stopped without cleaning up: its copy for the port stays.
    first.process.kill()
    first.process.wait()
    assert (tmp_path / "tollgate" / "servers" / f"{port}.admin-token").exists()
    # The same server (its token) back on another port, and another program on the old one.
    restarted = servers.start(
        env={
            "TOLLGATE_ADMIN_TOKEN": None,
            "XDG_STATE_HOME": state,
            "TOLLGATE_STATE": f"sqlite://{first.directory / 'rules.db'}",
        }
    )
    stand_in = StandIn("127.0.0.1", port, relay=restarted.url)
    try:
        with Client(f"http://127.0.0.1:{port}") as tollgate, pytest.raises(Unauthorized):
            tollgate.limits.list()
        stand_in.assert_never_sent(token)
        assert stand_in.heads, "the client went to the stand-in"
        assert "did not prove that it holds it" in caplog.text
    finally:
        stand_in.close()
    with Client(restarted.url) as tollgate:
        tollgate.limits.list()


async def test_a_kept_token_goes_to_the_recorded_address_not_where_localhost_leads(
    servers: ServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = str(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", state)
    # Another program where `localhost` leads first; the server on the other loopback address.
    first = str(socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)[0][4][0])
    other = "[::1]" if ":" not in first else "127.0.0.1"
    stand_in = StandIn(first, 0)
    try:
        server = servers.start(
            env={"TOLLGATE_ADMIN_TOKEN": None, "XDG_STATE_HOME": state},
            listen=f"{other}:{stand_in.port}",
        )
        token = _kept_token_of(server)
        url = f"http://localhost:{stand_in.port}"
        try:
            with Client(url) as tollgate:
                tollgate.limits.put("kept-token", kind="rate", limit=1, period_ms=1000)
            async with AsyncClient(url) as tollgate:
                assert (await tollgate.limits.get("kept-token"))["limit"] == 1
        finally:
            # First what the stand-in was sent, whether or not the calls went through.
            stand_in.assert_never_sent(token)
    finally:
        stand_in.close()
