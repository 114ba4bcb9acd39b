"""A TCP relay on the path into and out of the soak's network namespace, which can impair the
traffic it carries where the kernel has no `netem` queueing discipline.

While impaired (SIGUSR1 on, SIGUSR2 off), every chunk read from one side is written to the
other after DELAY_MS plus or minus JITTER_MS, in order, and LOSS_PERCENT of chunks wait one
more retransmission timeout (RTO_MS): what a TCP stream shows of a lossy, slow link, since
TCP hides a lost segment as a retransmission after its timeout. It is an emulation at the
stream level, not packet loss; the soak's report says which of the two it applied.

Usage: relay.py READY_FILE DELAY_MS JITTER_MS LOSS_PERCENT RTO_MS
       LISTEN_HOST:PORT=UPSTREAM_HOST:PORT [...]
"""

from __future__ import annotations

import asyncio
import functools
import random
import signal
import sys
import time
from pathlib import Path

from common import write_json


class Link:
    def __init__(self, delay_ms: float, jitter_ms: float, loss_percent: float, rto_ms: float):
        self.impaired = False
        self.delay = delay_ms / 1e3
        self.jitter = jitter_ms / 1e3
        self.loss = loss_percent / 100
        self.rto = rto_ms / 1e3
        self.random = random.Random()
        self.chunks = 0
        self.delayed = 0
        self.lost = 0

    def set_impaired(self, impaired: bool) -> None:
        self.impaired = impaired

    def hold(self) -> float:
        """How long to hold the chunk just read, in seconds."""
        self.chunks += 1
        if not self.impaired:
            return 0.0
        self.delayed += 1
        hold = self.delay + self.random.uniform(-self.jitter, self.jitter)
        if self.random.random() < self.loss:
            self.lost += 1
            hold += self.rto
        return max(hold, 0.0)


async def pump(link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction, each chunk released no earlier than its hold, in order."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def release() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()

    releaser = asyncio.create_task(release())
    last_due = 0.0
    try:
        while chunk := await reader.read(65536):
            last_due = max(last_due, time.monotonic() + link.hold())
            queue.put_nowait((last_due, chunk))
        queue.put_nowait((last_due, b""))
        await releaser
    except (ConnectionError, OSError):
        releaser.cancel()
    finally:
        writer.close()


async def relay(
    link: Link,
    upstream: tuple[str, int],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection(*upstream)
    except OSError:
        writer.close()
        return
    await asyncio.gather(
        pump(link, reader, up_writer), pump(link, up_reader, writer), return_exceptions=True
    )


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def main(argv: list[str]) -> None:
    ready = Path(argv[0])
    link = Link(float(argv[1]), float(argv[2]), float(argv[3]), float(argv[4]))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, link.set_impaired, True)
    loop.add_signal_handler(signal.SIGUSR2, link.set_impaired, False)
    servers = []
    for pair in argv[5:]:
        listen, _, upstream = pair.partition("=")
        target = address(upstream)
        host, port = address(listen)
        servers.append(
            await asyncio.start_server(functools.partial(relay, link, target), host, port)
        )
    stopped = asyncio.Event()
    for stop in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(stop, stopped.set)
    write_json(ready, {"listening": [pair.partition("=")[0] for pair in argv[5:]]})
    await stopped.wait()
    write_json(
        ready, {"chunks": link.chunks, "delayed": link.delayed, "lost": link.lost, "done": True}
    )
    for server in servers:
        server.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
