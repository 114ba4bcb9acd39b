"""What the clients and transports put on the wire for learning, against a scripted Tollgate
server (httpx.MockTransport): the lesson body, ``sent_after_ms`` on commit, which vendor answers
teach (only new things), the off switch, and a lesson that fails failing nothing."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx
import pytest

from tollgate_client import (
    AsyncClient,
    Client,
    Learned,
    LearnResult,
    Quota,
)
from tollgate_client.httpx import AsyncTollgateTransport, TollgateTransport

VENDOR = "api.vendor.test"
LEARNED = {
    "limit": "x",
    "configured": 20,
    "effective": 10,
    "paused_ms": 0,
    "learned": {"limit": 10, "kind": "advertised", "source": "s", "expires_in_ms": 600000},
}


class Tollgate:
    """A scripted Tollgate server: grants everything, answers lessons with ``learned``."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.learned: httpx.Response = httpx.Response(200, json=LEARNED)
        # A server older than learning: no sent_after_ms, no /v1/learn.
        self.old = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path == "/v1/acquire":
            return httpx.Response(200, json={"permit": f"p-{len(self.requests)}", "limits": []})
        if path.endswith("/commit"):
            if self.old and "sent_after_ms" in json.loads(request.content):
                return httpx.Response(
                    400,
                    json={
                        "error": {
                            "code": "bad_request",
                            "message": "sent_after_ms: unknown field `sent_after_ms`",
                            "field": "sent_after_ms",
                        }
                    },
                )
            return httpx.Response(200, json={"refunded": 0, "released": 0})
        if path == "/v1/learn" and not self.old:
            return self.learned
        if path == "/v1/pause":
            return httpx.Response(
                200, json={"paused_ms": json.loads(request.content)["retry_after_ms"]}
            )
        return httpx.Response(404, json={"error": {"code": "not_found", "message": path}})

    def bodies(self, path: str) -> list[Any]:
        return [
            json.loads(request.content)
            for request in self.requests
            if request.url.path == path or request.url.path.endswith(path)
        ]


class Vendor:
    """Answers in turn (the last repeats)."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        return self.answers[min(self.calls, len(self.answers)) - 1]


def github(limit: int, remaining: int, reset_in: int = 1) -> httpx.Response:
    reset = int(time.time()) + reset_in
    return httpx.Response(
        200,
        headers={
            "x-ratelimit-limit": str(limit),
            "x-ratelimit-remaining": str(remaining),
            "x-ratelimit-reset": str(reset),
        },
    )


def transport_over(tollgate: Tollgate, vendor: Vendor, **options: Any) -> httpx.Client:
    client = Client("http://tollgate.test", transport=httpx.MockTransport(tollgate))
    transport = TollgateTransport(
        client, {VENDOR: ["x", "y"]}, transport=httpx.MockTransport(vendor), **options
    )
    return httpx.Client(transport=transport)


def test_learn_body_and_answer() -> None:
    tollgate = Tollgate()
    with Client("http://tollgate.test", transport=httpx.MockTransport(tollgate)) as client:
        answer = client.learn(
            "x",
            source="by hand",
            quotas=[Quota(10, 1.0), (1000, 86400), 7],
            remaining=0,
            reset=0.85,
        )
        assert tollgate.bodies("/v1/learn")[-1] == {
            "limit": "x",
            "source": "by hand",
            "quotas": [
                {"quota": 10, "window_ms": 1000},
                {"quota": 1000, "window_ms": 86_400_000},
                {"quota": 7},
            ],
            "remaining": 0,
            "reset_ms": 850,
        }
        assert answer == LearnResult(
            limit="x",
            configured=20,
            effective=10,
            paused=0.0,
            learned=Learned(limit=10, kind="advertised", source="s", expires_after=600.0),
        )
        client.learn("x", source="s", rate_limited=True)
        assert tollgate.bodies("/v1/learn")[-1] == {
            "limit": "x",
            "source": "s",
            "quotas": [],
            "rate_limited": True,
        }
        tollgate.learned = httpx.Response(200, json={**LEARNED, "learned": None})
        assert client.learn("x", source="s").learned is None
        with pytest.raises(ValueError, match="reset"):
            client.learn("x", source="s", reset=-1)


def test_commit_sends_sent_after_in_milliseconds() -> None:
    tollgate = Tollgate()
    with Client("http://tollgate.test", transport=httpx.MockTransport(tollgate)) as client:
        client.acquire("x").commit(sent_after=0.0123)
        client.acquire("x").commit()
        assert tollgate.bodies("/commit") == [{"used": 1, "sent_after_ms": 13}, {"used": 1}]
        with pytest.raises(ValueError, match="sent_after"):
            client.acquire("x").commit(sent_after=-0.5)


async def test_async_learn_and_commit() -> None:
    tollgate = Tollgate()
    async with AsyncClient("http://tollgate.test", transport=httpx.MockTransport(tollgate)) as c:
        answer = await c.learn("x", source="s", quotas=[Quota(5)])
        assert answer.effective == 10
        permit = await c.acquire("x")
        await permit.commit(sent_after=0.002)
    assert tollgate.bodies("/v1/learn") == [{"limit": "x", "source": "s", "quotas": [{"quota": 5}]}]
    assert tollgate.bodies("/commit") == [{"used": 1, "sent_after_ms": 2}]


def test_the_transport_teaches_only_what_is_new() -> None:
    tollgate = Tollgate()
    vendor = Vendor(
        github(10, 9),
        github(10, 8),  # the same quota: nothing new
        github(12, 7),  # another quota
        github(12, 0),  # nothing remains
        httpx.Response(200),  # no headers at all
    )
    with transport_over(tollgate, vendor) as http:
        for _ in range(5):
            assert http.get(f"https://{VENDOR}/").status_code == 200
    lessons = tollgate.bodies("/v1/learn")
    assert [lesson["quotas"] for lesson in lessons] == [
        [{"quota": 10}],
        [{"quota": 12}],
        [{"quota": 12}],
    ]
    assert all(lesson["limit"] == "x" for lesson in lessons), "the host's first limit"
    assert lessons[0]["source"] == f"github headers from {VENDOR}"
    assert lessons[2]["remaining"] == 0
    assert 0 <= lessons[2]["reset_ms"] <= 2000
    commits = tollgate.bodies("/commit")
    assert len(commits) == 5
    assert all(0 <= commit["sent_after_ms"] < 5_000 for commit in commits)


def test_a_429_without_a_quota_teaches_rate_limited() -> None:
    tollgate = Tollgate()
    vendor = Vendor(httpx.Response(429, headers={"Retry-After": "0"}), httpx.Response(200))
    with transport_over(tollgate, vendor, resume_jitter_max=0.0) as http:
        assert http.get(f"https://{VENDOR}/").status_code == 200
    assert tollgate.bodies("/v1/learn") == [
        {"limit": "x", "source": f"HTTP 429 from {VENDOR}", "quotas": [], "rate_limited": True}
    ]


def test_a_429_advertising_a_quota_teaches_the_quota() -> None:
    tollgate = Tollgate()
    limited = httpx.Response(
        429,
        headers={"Retry-After": "0", "RateLimit-Policy": '"s";q=5;w=1', "RateLimit": '"s";r=0'},
    )
    with transport_over(tollgate, Vendor(limited, httpx.Response(200))) as http:
        http.get(f"https://{VENDOR}/")
    (lesson,) = tollgate.bodies("/v1/learn")
    assert lesson["quotas"] == [{"quota": 5, "window_ms": 1000}]
    assert "rate_limited" not in lesson
    assert lesson["remaining"] == 0


def test_a_pause_the_lesson_caused_is_kept_here() -> None:
    tollgate = Tollgate()
    tollgate.learned = httpx.Response(200, json={**LEARNED, "paused_ms": 30_000})
    with transport_over(tollgate, Vendor(github(10, 0, reset_in=30)), wait_max=0.5) as http:
        http.get(f"https://{VENDOR}/")
        acquires = len(tollgate.bodies("/v1/acquire"))
        with pytest.raises(Exception, match="paused"):
            http.get(f"https://{VENDOR}/")
    assert len(tollgate.bodies("/v1/acquire")) == acquires, "waited here, asked nothing"


def test_learning_off_sends_no_lesson_and_no_delay() -> None:
    tollgate = Tollgate()
    vendor = Vendor(github(10, 0), httpx.Response(429, headers={"Retry-After": "0"}))
    with transport_over(tollgate, vendor, learn=False, retries_max=0) as http:
        http.get(f"https://{VENDOR}/")
        http.get(f"https://{VENDOR}/")
    assert tollgate.bodies("/v1/learn") == []
    assert tollgate.bodies("/commit") == [{"used": 1}, {"used": 1}]


def test_a_failed_lesson_fails_nothing_and_a_refusal_is_not_repeated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tollgate = Tollgate()
    tollgate.learned = httpx.Response(
        403, json={"error": {"code": "forbidden", "message": "no may_pause"}}
    )
    with (
        caplog.at_level(logging.DEBUG, logger="tollgate_client"),
        transport_over(tollgate, Vendor(github(10, 0, reset_in=0))) as http,
    ):
        for _ in range(3):
            assert http.get(f"https://{VENDOR}/").status_code == 200
    assert len(tollgate.bodies("/v1/learn")) == 1
    assert "not taught" in caplog.text
    tollgate = Tollgate()
    tollgate.learned = httpx.Response(200, text="not json")
    with transport_over(tollgate, Vendor(github(10, 9))) as http:
        assert http.get(f"https://{VENDOR}/").status_code == 200


def test_learn_must_be_a_bool() -> None:
    client = Client("http://tollgate.test")
    with pytest.raises(TypeError, match="learn"):
        TollgateTransport(client, {VENDOR: "x"}, learn="no")  # type: ignore[arg-type]
    client.close()


async def test_the_async_transport_teaches_and_reports_the_delay() -> None:
    tollgate = Tollgate()
    vendor = Vendor(
        github(10, 9),
        github(10, 8),
        httpx.Response(429, headers={"Retry-After": "0"}),
        httpx.Response(200),
    )
    async with AsyncClient("http://tollgate.test", transport=httpx.MockTransport(tollgate)) as c:
        transport = AsyncTollgateTransport(
            c, {VENDOR: "x"}, transport=httpx.MockTransport(vendor), resume_jitter_max=0.0
        )
        async with httpx.AsyncClient(transport=transport) as http:
            for _ in range(3):
                await http.get(f"https://{VENDOR}/")
    lessons = tollgate.bodies("/v1/learn")
    assert [lesson.get("rate_limited", False) for lesson in lessons] == [False, True]
    assert all("sent_after_ms" in commit for commit in tollgate.bodies("/commit"))


def test_a_server_older_than_learning_still_gets_every_commit() -> None:
    tollgate = Tollgate()
    tollgate.old = True
    with transport_over(tollgate, Vendor(github(10, 0, reset_in=0))) as http:
        for _ in range(3):
            assert http.get(f"https://{VENDOR}/").status_code == 200
    commits = tollgate.bodies("/commit")
    assert [("sent_after_ms" in commit) for commit in commits] == [True, False, False, False]
    assert len(tollgate.bodies("/v1/learn")) == 1, "a lesson refused (404) is not repeated"


class Connecting(httpx.BaseTransport):
    """An inner transport that takes ``setup`` seconds (a connection, a TLS handshake) before
    writing the request's headers, reporting its steps as httpcore does."""

    def __init__(self, setup: float) -> None:
        self.setup = setup

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        trace = request.extensions.get("trace")
        time.sleep(self.setup)
        if trace is not None:
            trace("http11.send_request_headers.complete", {"request": request})
        return httpx.Response(200)


def test_the_delay_runs_until_the_request_is_written_and_a_callers_trace_stays() -> None:
    tollgate = Tollgate()
    seen: list[str] = []

    def own(name: str, info: dict[str, Any]) -> None:
        seen.append(name)

    client = Client("http://tollgate.test", transport=httpx.MockTransport(tollgate))
    transport = TollgateTransport(client, {VENDOR: "x"}, transport=Connecting(0.05))
    with httpx.Client(transport=transport) as http:
        answer = http.get(
            f"https://{VENDOR}/",
            extensions={"trace": own},
        )
    assert answer.status_code == 200
    (commit,) = tollgate.bodies("/commit")
    assert commit["sent_after_ms"] >= 50, "from the grant until the headers were written"
    assert seen == ["http11.send_request_headers.complete"], "the caller's trace is called"
    assert answer.request.extensions["trace"] is own, "and given back"


def test_the_servers_hold_of_an_acquire_is_read_from_server_timing() -> None:
    from tollgate_client._core import server_held

    assert server_held("acquire;dur=12.5") == 0.0125
    assert server_held("db;dur=1, acquire; dur=3") == 0.003
    bad_values = [None, "", "acquire", "acquire;dur=-1", "acquire;dur=nan", "acquire;dur="]
    for bad in [*bad_values, "other;dur=3"]:
        assert server_held(bad) is None, bad
