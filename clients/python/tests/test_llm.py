"""The token-budget transports judged by `tollgate-mock-model` (a real binary), which counts
requests, input and output tokens on its own clock and answers 429 past its limits, against a
real server. Safety (no 429, no window over) is asserted exactly."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _support import ADMIN_TOKEN, Server, find_binary, unique
from tollgate_client import AsyncClient, Client
from tollgate_client.httpx import AsyncTollgateTransport, TollgateTransport
from tollgate_client.llm import (
    AsyncLlmTransport,
    Budget,
    LlmTransport,
    UsageReader,
    estimate,
    recognise,
)

PERIOD_MS = 3_000
RPM, ITPM, OTPM = 100, 40_000, 3_000


class MockModel:
    def __init__(self, directory: Path, *args: str) -> None:
        given = os.environ.get("TOLLGATE_MOCK_MODEL_BIN")
        binary = given or str(Path(find_binary()).parent / "tollgate-mock-model")
        if not os.access(binary, os.X_OK):
            pytest.fail(
                f"no tollgate-mock-model at {binary!r}: build it (cargo build -p tollgate-fleet "
                "--bin tollgate-mock-model) or set TOLLGATE_MOCK_MODEL_BIN",
                pytrace=False,
            )
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "model.log", "wb") as log:
            self.process = subprocess.Popen(
                [binary, "--listen", "127.0.0.1:0", *args], stdout=subprocess.PIPE, stderr=log
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        self.url = line.split("listening on ", 1)[1].strip()
        self.host = self.url.removeprefix("http://")

    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = httpx.get(f"{self.url}/_model/report").json()
        return report

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def model(tmp_path: Path) -> Iterator[MockModel]:
    running = MockModel(
        tmp_path / "model",
        "--rpm",
        str(RPM),
        "--itpm",
        str(ITPM),
        "--otpm",
        str(OTPM),
        "--period-ms",
        str(PERIOD_MS),
    )
    yield running
    running.stop()


def budget_on(client: Client) -> Budget:
    names = {kind: unique(f"llm-{kind}") for kind in ("requests", "input", "output", "overrun")}
    client.limits.put(names["requests"], kind="rate", limit=RPM, period_ms=PERIOD_MS)
    client.limits.put(names["input"], kind="rate", limit=ITPM, period_ms=PERIOD_MS)
    client.limits.put(names["output"], kind="rate", limit=OTPM, period_ms=PERIOD_MS)
    client.limits.put(names["overrun"], kind="concurrency", limit=1, lease_ttl_ms=60_000)
    return Budget(
        requests=names["requests"],
        input=names["input"],
        output=names["output"],
        overrun=names["overrun"],
        output_default=200,
    )


def used(server: Server, name: str) -> int:
    answer = httpx.get(
        f"{server.url}/v1/stats",
        params={"limit": name},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    (limit,) = [entry for entry in answer.json()["limits"] if entry["name"] == name]
    return int(limit["usage"]["used"])


def test_paths_estimates_and_usage_are_read() -> None:
    assert recognise("/v1/chat/completions") == "chat"
    assert recognise("/v1/messages?beta=true") == "messages"
    assert recognise("/v1/embeddings") is None
    budget = Budget(requests="r", input="i", output="o", output_default=99)
    body = b'{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}'
    found = estimate("messages", body, budget)
    assert (found.input, found.output, found.bounded) == (len(body) + 8 + 16, 50, True)
    assert estimate("chat", b'{"messages":[]}', budget).output == 99
    with pytest.raises(ValueError, match=r"^max_tokens:"):
        estimate("chat", b'{"max_tokens":"x"}', budget)
    reader = UsageReader(events=True)
    reader.feed(b'data: {"choices":[{"delta":{"content":"hel')
    reader.feed(
        b'lo"}}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
    )
    reader.end()
    assert (reader.usage.input, reader.usage.output, reader.usage.streamed) == (5, 2, 5)


def call(rng: random.Random, vendor: httpx.Client, model: MockModel, bounded: bool = True) -> None:
    path, field = rng.choice(
        [
            ("/v1/chat/completions", "max_tokens"),
            ("/v1/responses", "max_output_tokens"),
            ("/v1/messages", "max_tokens"),
        ]
    )
    key = "input" if path == "/v1/responses" else "messages"
    body: dict[str, Any] = {
        "model": "mock-1",
        key: [{"role": "user", "content": "word " * rng.randint(4, 60)}],
    }
    if bounded:
        body[field] = 200
    stream = rng.random() < 0.7
    body["stream"] = stream
    tokens = rng.randint(10, 200)
    headers = {"x-mock-tokens": str(tokens)}
    chance = rng.random()
    if chance < 0.05:
        headers["x-mock-fail-after"] = str(rng.randrange(tokens))
    elif chance < 0.1:
        headers["x-mock-cut-after"] = str(rng.randrange(tokens))
    try:
        with vendor.stream("POST", f"{model.url}{path}", json=body, headers=headers) as answer:
            for index, _ in enumerate(answer.iter_raw()):
                if stream and chance > 0.95 and index >= 2:
                    break  # cancelled: the block closes the stream
    except httpx.HTTPError:
        pass  # cut off on demand


def test_threads_sharing_a_budget_never_pass_the_models_limits(
    client: Client, server: Server, model: MockModel
) -> None:
    budget = budget_on(client)
    failures: list[BaseException] = []

    def caller(seed: int) -> None:
        rng = random.Random(seed)
        with (
            Client(server.url) as tollgate,
            httpx.Client(
                transport=LlmTransport(tollgate, {model.host: budget}), timeout=60
            ) as vendor,
        ):
            until = time.monotonic() + 8
            try:
                while time.monotonic() < until:
                    call(rng, vendor, model)
            except BaseException as error:
                failures.append(error)

    threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    report = model.report()
    assert report["limited"] == 0, report
    assert report["most_output_in_any_window"] <= OTPM, report
    assert report["most_input_in_any_window"] <= ITPM, report
    assert report["ok"] > 20, report


def test_a_cancelled_stream_is_charged_its_input_and_what_it_streamed(
    client: Client, server: Server, model: MockModel
) -> None:
    budget = budget_on(client)
    with httpx.Client(transport=LlmTransport(client, {model.host: budget})) as vendor:
        body = {
            "model": "m",
            "max_tokens": 100,
            "stream": True,
            "messages": [{"role": "user", "content": "hello"}],
        }
        with vendor.stream(
            "POST", f"{model.url}/v1/chat/completions", json=body, headers={"x-mock-tokens": "100"}
        ) as answer:
            for _ in answer.iter_raw():
                break
        # Cancelled after the first chunk: its input estimate and the bytes streamed stay
        # charged (at least one token), never the whole reservation refunded nor kept.
        charged = used(server, budget.output)
        assert 1 <= charged < 100, charged
        assert used(server, budget.input) > 0
        assert used(server, budget.requests) == 1


async def test_the_async_transport_settles_the_reported_usage(
    client: Client, server: Server, model: MockModel
) -> None:
    budget = budget_on(client)
    async with (
        AsyncClient(server.url) as tollgate,
        httpx.AsyncClient(transport=AsyncLlmTransport(tollgate, {model.host: budget})) as vendor,
    ):
        body = {
            "model": "m",
            "max_tokens": 100,
            "stream": True,
            "messages": [{"role": "user", "content": "hello"}],
        }
        async with vendor.stream(
            "POST", f"{model.url}/v1/messages", json=body, headers={"x-mock-tokens": "37"}
        ) as answer:
            async for _ in answer.aiter_raw():
                pass
    assert used(server, budget.output) == 37
    assert used(server, budget.input) == 3 + 2  # the model's own count of "hello"
    await asyncio.sleep(0)


def test_an_unbounded_stream_past_its_estimate_is_topped_up(
    client: Client, server: Server, model: MockModel
) -> None:
    budget = budget_on(client)
    with httpx.Client(transport=LlmTransport(client, {model.host: budget})) as vendor:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with vendor.stream(
            "POST", f"{model.url}/v1/messages", json=body, headers={"x-mock-tokens": "500"}
        ) as answer:
            for _ in answer.iter_raw():
                pass
    # Estimated 200 (output_default); the model wrote 500: all 500 are counted.
    assert used(server, budget.output) == 500


class Recording(httpx.BaseTransport):
    """The client's own transport, noting each call to the server: (path, JSON body)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.calls: list[tuple[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.url.path, json.loads(request.content or b"null")))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_an_uncapped_stream_past_a_full_limit_is_charged_before_its_lease_goes(
    client: Client, server: Server, model: MockModel
) -> None:
    budget = budget_on(client)
    # Room for the estimate (200) and one top-up (64) at most: most of the 500 tokens the model
    # writes can only be charged.
    client.limits.put(budget.output, kind="rate", limit=300, period_ms=60_000)
    recording = Recording()
    with (
        Client(server.url, transport=recording) as tollgate,
        httpx.Client(transport=LlmTransport(tollgate, {model.host: budget})) as vendor,
    ):
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with vendor.stream(
            "POST", f"{model.url}/v1/messages", json=body, headers={"x-mock-tokens": "500"}
        ) as answer:
            for _ in answer.iter_raw():
                pass
    # One acquire of the request, both estimates and the overrun lease.
    path, asked = recording.calls[0]
    assert path == "/v1/acquire"
    assert asked["limits"] == [budget.requests, budget.input, budget.output, budget.overrun]
    assert asked["costs"][budget.output] == 200
    # Every token the model wrote is counted, past the limit: later grants wait it out.
    assert used(server, budget.output) == 500
    assert client.try_acquire(budget.output, priority="high") is None
    # The charge came before the commit that gave the overrun lease back.
    paths = [path for path, _ in recording.calls]
    charge = paths.index("/v1/charge")
    (settled,) = [
        index
        for index, (path, sent) in enumerate(recording.calls)
        if path.endswith("/commit") and isinstance(sent["used"], dict)
    ]
    assert charge < settled, paths
    assert recording.calls[settled][1]["used"] == {
        budget.requests: 1,
        budget.input: recording.calls[settled][1]["used"][budget.input],
        budget.output: 200,
    }
    assert set(recording.calls[charge][1]["costs"]) == {budget.output}
    assert budget.overrun is not None
    assert client.try_acquire(budget.overrun) is not None


def test_one_limit_for_input_and_output_is_named_once_and_counts_both(
    client: Client, server: Server, model: MockModel
) -> None:
    budget = budget_on(client)
    budget.output = budget.input  # one TPM, as a vendor that counts both together has
    with httpx.Client(transport=LlmTransport(client, {model.host: budget})) as vendor:
        body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hello"}]}
        answer = vendor.post(f"{model.url}/v1/messages", json=body, headers={"x-mock-tokens": "37"})
        assert answer.status_code == 200
    assert used(server, budget.input) == 3 + 2 + 37
    assert used(server, budget.requests) == 1


def test_the_main_transport_keeps_a_budget(
    client: Client, server: Server, model: MockModel
) -> None:
    budget = budget_on(client)
    transport = TollgateTransport(client, {}, llm={model.host: budget})
    with httpx.Client(transport=transport) as vendor:
        body = {
            "model": "m",
            "max_tokens": 100,
            "stream": True,
            "messages": [{"role": "user", "content": "hello"}],
        }
        with vendor.stream(
            "POST", f"{model.url}/v1/chat/completions", json=body, headers={"x-mock-tokens": "37"}
        ) as answer:
            for _ in answer.iter_raw():
                pass
        # Not a model call: passes untouched, taking nothing.
        assert vendor.get(f"{model.url}/_model/report").json()["ok"] == 1
    assert used(server, budget.output) == 37
    assert used(server, budget.input) == 3 + 2
    assert used(server, budget.requests) == 1


async def test_the_main_async_transport_keeps_a_budget_and_the_hosts_quota(
    client: Client, server: Server, model: MockModel
) -> None:
    budget = budget_on(client)
    calls = unique("llm-calls")
    client.limits.put(calls, kind="rate", limit=100, period_ms=PERIOD_MS)
    async with AsyncClient(server.url) as tollgate:
        transport = AsyncTollgateTransport(tollgate, {model.host: calls}, llm={model.host: budget})
        async with httpx.AsyncClient(transport=transport) as vendor:
            body = {"model": "m", "max_tokens": 100, "input": "hello"}
            answer = await vendor.post(
                f"{model.url}/v1/responses", json=body, headers={"x-mock-tokens": "12"}
            )
            assert answer.status_code == 200
    # The budget settled the model's usage, and the host's own limit took its unit.
    assert used(server, budget.output) == 12
    assert used(server, budget.requests) == 1
    assert used(server, calls) == 1


def test_the_hosts_may_be_empty_only_with_a_budget(client: Client) -> None:
    with pytest.raises(ValueError, match=r"^hosts: "):
        TollgateTransport(client, {})
