"""One process of the token-budget fleet test (``test_llm_fleet.py``): CALLERS threads call the
mock model through ``TollgateTransport(..., llm=...)`` until SECONDS have passed, each calling
again as soon as its call ends: chat completions, responses or messages at random, 70 %
streamed, random lengths, every request setting its output cap, 5 % failed by the model, 5 %
cut off, 5 % of streams cancelled by the caller.

    python _llm_worker.py SERVER_URL MODEL_URL CALLERS SECONDS SEED BUDGET_JSON

Prints ``ready``, waits for a line on stdin, runs, and prints ``stats <sent> <vendor_429>
<errors>``.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from typing import Any

import httpx

from tollgate_client import Client
from tollgate_client.httpx import TollgateTransport
from tollgate_client.llm import Budget

#: Every request's output cap; the model writes 10 to this many tokens.
CAP = 300


def one_call(rng: random.Random, vendor: httpx.Client, model: str) -> int:
    """One random call; its status (0 when it was cut off)."""
    path, cap, key = rng.choice(
        [
            ("/v1/chat/completions", "max_tokens", "messages"),
            ("/v1/responses", "max_output_tokens", "input"),
            ("/v1/messages", "max_tokens", "messages"),
        ]
    )
    stream = rng.random() < 0.7
    body: dict[str, Any] = {
        "model": "mock-1",
        cap: CAP,
        "stream": stream,
        key: [{"role": "user", "content": "word " * rng.randint(4, 80)}],
    }
    tokens = rng.randint(10, CAP)
    headers = {"x-mock-tokens": str(tokens)}
    chance = rng.random()
    if chance < 0.05:
        headers["x-mock-fail-after"] = str(rng.randrange(tokens))
    elif chance < 0.1:
        headers["x-mock-cut-after"] = str(rng.randrange(tokens))
    cancel_after = rng.randint(1, 8) if stream and chance >= 0.95 else None
    try:
        with vendor.stream("POST", f"{model}{path}", json=body, headers=headers) as answer:
            for index, _ in enumerate(answer.iter_raw()):
                if cancel_after is not None and index + 1 >= cancel_after:
                    break  # cancelled: closing the block settles what streamed
            return answer.status_code
    except httpx.HTTPError:
        return 0  # cut off on demand


def main() -> None:
    server, model, callers, seconds, seed, budget_json = sys.argv[1:7]
    budget = Budget(**json.loads(budget_json))
    host = httpx.URL(model)
    tally = {"sent": 0, "limited": 0, "errors": 0}
    lock = threading.Lock()
    print("ready", flush=True)
    sys.stdin.readline()
    until = time.monotonic() + float(seconds)

    def caller(index: int) -> None:
        rng = random.Random(int(seed) * 1000 + index)
        with (
            Client(server) as tollgate,
            httpx.Client(
                transport=TollgateTransport(tollgate, {}, llm={f"{host.host}:{host.port}": budget}),
                timeout=60,
            ) as vendor,
        ):
            while time.monotonic() < until:
                try:
                    status = one_call(rng, vendor, model)
                except Exception as error:  # counted; the test fails on any
                    print(f"error: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
                    with lock:
                        tally["errors"] += 1
                    continue
                with lock:
                    tally["sent"] += 1
                    tally["limited"] += status == 429

    threads = [threading.Thread(target=caller, args=(index,)) for index in range(int(callers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"stats {tally['sent']} {tally['limited']} {tally['errors']}", flush=True)


if __name__ == "__main__":
    main()
