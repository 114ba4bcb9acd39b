"""Another model API plugged into a token budget (``Budget(api=Custom(...))``): a made-up
vendor served here (``POST /v2/generate`` answering JSON, ``POST /v2/stream`` answering
newline-delimited JSON), estimated and read by the test's own functions, against a real
server, whose counts are read back through ``/v1/stats``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from _support import ADMIN_TOKEN, Server, unique
from tollgate_client import AsyncClient, Client
from tollgate_client.httpx import TollgateTransport
from tollgate_client.llm import AsyncLlmTransport, Budget, Custom, Estimate, LlmTransport, Usage

#: The vendor's output when a request sets no limit: far past the estimator's guess.
UNCAPPED_WORDS = 300
OUTPUT_GUESS = 10


def vendor_counts(body: dict[str, Any]) -> tuple[int, int]:
    """The vendor's own count of a request: input a token per word plus 3, output a token per
    word written (the request's ``limit``, else 300)."""
    return len(str(body["prompt"]).split()) + 3, int(body.get("limit") or UNCAPPED_WORDS)


class _Vendor(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        used_in, used_out = vendor_counts(body)
        used = {"in": used_in, "out": used_out}
        self.send_response(200)
        if self.path == "/v2/generate":
            answer = json.dumps({"text": "tok " * used_out, "used": used}).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            return
        # /v2/stream: a line a word, then the counts; the connection's close ends it.
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        for _ in range(used_out):
            self.wfile.write(b'{"text":"tok "}\n')
        self.wfile.write(json.dumps({"used": used}).encode() + b"\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        answer = b'{"models":["tiny"]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


@pytest.fixture
def vendor() -> Iterator[str]:
    listening = ThreadingHTTPServer(("127.0.0.1", 0), _Vendor)
    thread = threading.Thread(target=listening.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listening.server_address[1]}"
    listening.shutdown()
    listening.server_close()


def estimate_generate(request: httpx.Request) -> Estimate | None:
    """The caller's estimator: generation calls only; input a token per byte of the prompt plus
    the vendor's 3 (never fewer than its words), output the request's limit, else a guess."""
    if request.method != "POST" or not request.url.path.startswith("/v2/"):
        return None
    body = json.loads(request.content)
    limit = body.get("limit")
    return Estimate(
        input=len(str(body["prompt"]).encode()) + 3,
        output=limit if limit is not None else OUTPUT_GUESS,
        bounded=limit is not None,
    )


class LinesReader:
    """The caller's reader: newline-delimited JSON objects, text counted as it streams and the
    vendor's ``used`` read when it comes (a JSON answer is one such object)."""

    def __init__(self) -> None:
        self._usage = Usage()
        self._line = b""

    @property
    def usage(self) -> Usage:
        return self._usage

    def _read(self, line: bytes) -> None:
        if not line.strip():
            return
        part = json.loads(line)
        self._usage.streamed += len(str(part.get("text", "")).encode())
        if "used" in part:
            self._usage.input = part["used"]["in"]
            self._usage.output = part["used"]["out"]
            self._usage.finished = True

    def feed(self, chunk: bytes) -> None:
        *lines, self._line = (self._line + chunk).split(b"\n")
        for line in lines:
            self._read(line)

    def end(self) -> None:
        self._read(self._line)
        self._line = b""


GENERATE = Custom(estimate=estimate_generate, reader=LinesReader)


def budget_on(client: Client, output_limit: int = 100_000) -> Budget:
    names = {kind: unique(f"gen-{kind}") for kind in ("requests", "input", "output", "overrun")}
    client.limits.put(names["requests"], kind="rate", limit=100, period_ms=60_000)
    client.limits.put(names["input"], kind="rate", limit=100_000, period_ms=60_000)
    client.limits.put(names["output"], kind="rate", limit=output_limit, period_ms=60_000)
    client.limits.put(names["overrun"], kind="concurrency", limit=1, lease_ttl_ms=60_000)
    return Budget(
        requests=names["requests"],
        input=names["input"],
        output=names["output"],
        overrun=names["overrun"],
        api=GENERATE,
    )


def used(server: Server, name: str) -> int:
    answer = httpx.get(
        f"{server.url}/v1/stats",
        params={"limit": name},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    (limit,) = [entry for entry in answer.json()["limits"] if entry["name"] == name]
    return int(limit["usage"]["used"])


def counted(server: Server, budget: Budget) -> tuple[int, int, int]:
    return (
        used(server, budget.requests),
        used(server, budget.input),
        used(server, budget.output),
    )


def test_another_api_is_settled_with_what_its_vendor_reported(
    client: Client, server: Server, vendor: str
) -> None:
    budget = budget_on(client)
    body = {"prompt": "say three short words", "limit": 25}
    with httpx.Client(transport=LlmTransport(client, {vendor: budget})) as calls:
        answer = calls.post(f"http://{vendor}/v2/generate", json=body)
    assert answer.json()["used"] == {"in": 7, "out": 25}
    # Estimated 24 input and 25 output; the vendor's counts settle it.
    assert counted(server, budget) == (1, 7, 25)


def test_a_request_the_estimator_declines_passes_unbudgeted(
    client: Client, server: Server, vendor: str
) -> None:
    budget = budget_on(client)
    transport = TollgateTransport(client, {}, llm={vendor: budget})
    with httpx.Client(transport=transport) as calls:
        assert calls.get(f"http://{vendor}/v2/models").json() == {"models": ["tiny"]}
    assert counted(server, budget) == (0, 0, 0)


def test_a_bad_estimate_is_refused_naming_the_field(client: Client, vendor: str) -> None:
    budget = budget_on(client)
    budget.api = Custom(
        estimate=lambda _request: Estimate(input=-1, output=5, bounded=True), reader=LinesReader
    )
    with (
        httpx.Client(transport=LlmTransport(client, {vendor: budget})) as calls,
        pytest.raises(ValueError, match=r"^Estimate\.input: must be a whole number of tokens$"),
    ):
        calls.post(f"http://{vendor}/v2/generate", json={"prompt": "x"})


async def test_another_apis_stream_past_its_estimate_is_charged(
    client: Client, server: Server, vendor: str
) -> None:
    # An output limit of 200: the 300 tokens streamed are past any top-up, so what ran past
    # the grant of 10 is charged at the end, a debt on the limit.
    budget = budget_on(client, output_limit=200)
    async with (
        AsyncClient(server.url, token=ADMIN_TOKEN) as tollgate,
        httpx.AsyncClient(transport=AsyncLlmTransport(tollgate, {vendor: budget})) as calls,
        calls.stream(
            "POST", f"http://{vendor}/v2/stream", json={"prompt": "write at length"}
        ) as answer,
    ):
        lines = [line async for line in answer.aiter_lines() if line]
    assert len(lines) == UNCAPPED_WORDS + 1
    assert json.loads(lines[-1]) == {"used": {"in": 6, "out": UNCAPPED_WORDS}}
    assert counted(server, budget) == (1, 6, UNCAPPED_WORDS)
