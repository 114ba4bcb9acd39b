"""The key flood: acquires on the keyed limit `flood`, each with a key never used before,
through the servers' HTTP API, pipelined on a few keep-alive connections (plain sockets: an
HTTP client library would cost more CPU than the servers).

Writes its progress as JSON every second, and once more when it stops (SIGTERM, or once
KEYS_MAX keys were sent): keys sent, and per target the answers by status and code.

Usage: flood.py KEYS_MAX PROGRESS_FILE NAME=HOST:PORT[,NAME=HOST:PORT...] [DEPTH]
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

from common import FLOOD_LIMIT, stop_on_sigterm, write_json

CODE = re.compile(rb'"code":"([a-z_]+)"')
REASON = re.compile(rb'"reason":"([a-z_]+)"')
# The servers' data token, which soak.py hands every process it starts.
_TOKEN = os.environ.get("TOLLGATE_SOAK_DATA_TOKEN", "")
AUTHORIZATION = b"authorization: Bearer %s\r\n" % _TOKEN.encode() if _TOKEN else b""


class Flood:
    def __init__(self, keys_max: int, progress: Path) -> None:
        self.keys_max = keys_max
        self.progress = progress
        self.sent = 0
        self.started = time.time()
        self.answers: dict[str, dict[str, int]] = {}
        self.stopping = stop_on_sigterm()

    def next_key(self) -> int | None:
        if self.sent >= self.keys_max or self.stopping[0]:
            return None
        self.sent += 1
        return self.sent

    def note(self, target: str, outcome: str, count: int = 1) -> None:
        answers = self.answers.setdefault(target, {})
        answers[outcome] = answers.get(outcome, 0) + count

    def write_progress(self, done: bool) -> None:
        elapsed = time.time() - self.started
        write_json(
            self.progress,
            {
                "keys_sent": self.sent,
                "keys_max": self.keys_max,
                "elapsed_s": round(elapsed, 3),
                "keys_per_s": round(self.sent / elapsed, 1) if elapsed > 0 else 0.0,
                "answers": self.answers,
                "done": done,
            },
        )

    async def connection(self, target: str, host: str, port: int, depth: int) -> None:
        while not self.stopping[0] and self.sent < self.keys_max:
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                self.note(target, "unreachable")
                await asyncio.sleep(0.2)
                continue
            try:
                await self.pipeline(target, reader, writer, depth)
            except (OSError, asyncio.IncompleteReadError):
                self.note(target, "unreachable")
                await asyncio.sleep(0.2)
            finally:
                writer.close()

    async def pipeline(
        self,
        target: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        depth: int,
    ) -> None:
        while True:
            batch = []
            for _ in range(depth):
                key = self.next_key()
                if key is None:
                    break
                body = b'{"limits":["%s"],"key":"k%x"}' % (FLOOD_LIMIT.encode(), key)
                batch.append(
                    b"POST /v1/acquire HTTP/1.1\r\nhost: 127.0.0.1\r\n%s"
                    b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (AUTHORIZATION, len(body), body)
                )
            if not batch:
                return
            writer.write(b"".join(batch))
            await writer.drain()
            for _ in batch:
                head = await reader.readuntil(b"\r\n\r\n")
                status = head[9:12].decode()
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length)
                if status == "200":
                    self.note(target, "granted")
                else:
                    code = CODE.search(body)
                    reason = REASON.search(body)
                    outcome = code.group(1).decode() if code else f"http_{status}"
                    if reason:
                        outcome += ":" + reason.group(1).decode()
                    self.note(target, outcome)

    async def report_every_second(self) -> None:
        while not self.stopping[0] and self.sent < self.keys_max:
            self.write_progress(done=False)
            await asyncio.sleep(1.0)


async def main(keys_max: int, progress: Path, targets: str, depth: int) -> None:
    flood = Flood(keys_max, progress)
    tasks = []
    for entry in targets.split(","):
        name, _, address = entry.partition("=")
        host, _, port = address.rpartition(":")
        tasks.append(flood.connection(name, host, int(port), depth))
    await asyncio.gather(flood.report_every_second(), *tasks)
    flood.write_progress(done=True)


if __name__ == "__main__":
    depth_ = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    asyncio.run(main(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], depth_))
