"""Acquire+commit pairs per second through tollgate_client, against a running server.

Usage: acquire_commit.py URL TOKEN LIMIT SECONDS CONCURRENCY. With CONCURRENCY 1, the
synchronous `Client`, one pair after another; above it, that many tasks on one `AsyncClient`.
Each acquires one unit of LIMIT and commits it, for SECONDS; prints one JSON line
{client, concurrency, pairs, seconds, pairs_per_s}. Run by scripts/bench-clients beside the
TypeScript client's twin (clients/typescript/bench).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from tollgate_client import AsyncClient, Client


def sequential(url: str, token: str, limit: str, seconds: float) -> int:
    pairs = 0
    with Client(url, token=token) as client:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            client.acquire(limit).commit(1)
            pairs += 1
    return pairs


async def concurrent(url: str, token: str, limit: str, seconds: float, workers: int) -> int:
    pairs = 0
    end = time.perf_counter() + seconds

    async def worker(client: AsyncClient) -> None:
        nonlocal pairs
        while time.perf_counter() < end:
            permit = await client.acquire(limit)
            await permit.commit(1)
            pairs += 1

    async with AsyncClient(url, token=token) as client:
        await asyncio.gather(*(worker(client) for _ in range(workers)))
    return pairs


def main() -> None:
    url, token, limit = sys.argv[1], sys.argv[2], sys.argv[3]
    seconds, workers = float(sys.argv[4]), int(sys.argv[5])
    started = time.perf_counter()
    if workers == 1:
        pairs = sequential(url, token, limit, seconds)
    else:
        pairs = asyncio.run(concurrent(url, token, limit, seconds, workers))
    elapsed = time.perf_counter() - started
    print(json.dumps({"client": "python", "concurrency": workers, "pairs": pairs,
                      "seconds": elapsed, "pairs_per_s": pairs / elapsed}))


if __name__ == "__main__":
    main()
