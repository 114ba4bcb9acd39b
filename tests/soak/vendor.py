"""The mock vendor: the oracle's eyes. Every worker calls it after each grant; it notes the
arrival time of every call, on its own clock, and knows nothing of Tollgate.

    GET /call?l=LIMIT&id=CALL                        a call made under a rate grant
    GET /begin?l=LIMIT&id=SEG&p=PID&f=FENCE&u=UNTIL  a lease holder starts work (a write)
    GET /end?l=LIMIT&id=SEG&p=PID&f=FENCE            ... and finishes it (a second write)
    GET /holders                                     pids in the middle of work, as JSON
    GET /dump?path=FILE                              write every record to FILE (CSV)

On a fenced limit a write (begin or end) whose fencing token is below the highest one seen
is refused with 409, as a storage service guarded by fencing tokens would: the writer's lease
ended, and a later holder has written since.

Usage: vendor.py PORT READY_FILE
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from common import CONCURRENCY_LIMITS, write_json

FENCED = {limit.name for limit in CONCURRENCY_LIMITS if limit.fenced}


class Vendor:
    def __init__(self) -> None:
        #: (arrival_us, kind, limit, id, pid, fence, until_us, accepted)
        self.records: list[tuple[int, str, str, str, int, int, int, int]] = []
        self.highest_fence: dict[str, int] = {}
        #: Work begun and not ended: segment id -> (pid, limit, until_us).
        self.open: dict[str, tuple[int, str, int]] = {}

    def handle(self, target: str) -> tuple[int, bytes]:
        arrival_us = time.time_ns() // 1_000
        url = urlsplit(target)
        query = dict(parse_qsl(url.query))
        path = url.path
        if path == "/call":
            self.records.append((arrival_us, "call", query["l"], query["id"], 0, 0, 0, 1))
            return 200, b"ok"
        if path in ("/begin", "/end"):
            return self.write(arrival_us, path[1:], query)
        if path == "/holders":
            holders = sorted({pid for pid, _, until in self.open.values() if until > arrival_us})
            return 200, json.dumps(holders).encode()
        if path == "/dump":
            self.dump(Path(query["path"]))
            return 200, b"ok"
        return 404, b"unknown"

    def write(self, arrival_us: int, kind: str, query: dict[str, str]) -> tuple[int, bytes]:
        limit, segment = query["l"], query["id"]
        pid, fence = int(query["p"]), int(query["f"])
        until = int(query.get("u", "0"))
        accepted = True
        if limit in FENCED:
            highest = self.highest_fence.get(limit, 0)
            if fence < highest:
                accepted = False
            else:
                self.highest_fence[limit] = fence
        if kind == "begin":
            self.open[segment] = (pid, limit, until)
        else:
            self.open.pop(segment, None)
        self.records.append(
            (arrival_us, kind, limit, segment, pid, fence, until, 1 if accepted else 0)
        )
        return (200, b"ok") if accepted else (409, b"stale fencing token")

    def dump(self, path: Path) -> None:
        with path.open("w", encoding="utf-8") as out:
            for record in self.records:
                out.write(",".join(str(field) for field in record) + "\n")


async def serve(vendor: Vendor, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if length:
                await reader.readexactly(length)
            status, body = vendor.handle(target) if method in ("GET", "POST") else (405, b"")
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 409: "Conflict"}
            writer.write(
                f"HTTP/1.1 {status} {reason[status]}\r\ncontent-length: {len(body)}\r\n"
                "content-type: text/plain\r\n\r\n".encode()
                + body
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main(port: int, ready: Path) -> None:
    vendor = Vendor()
    server = await asyncio.start_server(
        lambda reader, writer: serve(vendor, reader, writer), "127.0.0.1", port, backlog=512
    )
    write_json(ready, {"port": port})
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), Path(sys.argv[2])))
