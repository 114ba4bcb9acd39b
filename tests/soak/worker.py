"""A worker process taking permits through the Tollgate servers with the Python client, then
calling the mock vendor under each grant. Each task loops until SIGTERM.

- ``rate``: takes one unit of one rate limit, or of several all or none, at a random priority,
  answered at once or after a wait; calls the vendor once per limit granted; commits.
- ``holder``: takes a lease (``conc`` or ``mutex``), works under it in segments (a vendor
  ``begin`` and ``end`` around each, carrying the fencing token), renews it after each
  segment and releases it at the end. A holder stopped (SIGSTOP) past its lease's TTL finds
  out at its next renewal, which must be refused.

Records (see ``common.Records``), times in microseconds since the epoch:

    g ID LIMIT[,LIMIT] PRIORITY WAIT_MS SENT RECEIVED      a rate grant, decided in [SENT, RECEIVED]
    L ID LIMIT PRIORITY FENCE SENT RECEIVED                a lease granted
    r ID LIMIT OUTCOME SENT RECEIVED EXPIRED_BY            a renewal: ok, refused or error:CODE;
                                                           the lease had surely expired if
                                                           SENT > EXPIRED_BY
    c SECOND KIND DETAIL COUNT                             decisions, denials, errors per second

Usage: worker.py ROLE TAG SERVERS VENDOR RECORDS SEED TASKS
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path

from tollgate_client import (
    AsyncClient,
    AsyncPermit,
    Conflict,
    NotFound,
    RateLimited,
    ServerUnreachable,
    StoreUnavailable,
    TollgateError,
)

from common import (
    PRIORITIES,
    RATE_REQUESTS,
    Records,
    VendorLink,
    concurrency_limit,
    now_us,
    stop_on_sigterm,
)

#: A holder starts a segment only if it ends this long before its lease could expire.
SEGMENT_GUARD_US = 400_000


class Worker:
    def __init__(
        self, tag: str, servers: list[str], vendor: str, records: Records, seed: int
    ) -> None:
        self.tag = tag
        self.pid = os.getpid()
        # The servers' data token, which soak.py hands every process it starts.
        token = os.environ.get("TOLLGATE_SOAK_DATA_TOKEN") or None
        self.clients = [AsyncClient(url, token=token, timeout=5.0) for url in servers]
        self.current = 0
        self.vendor = VendorLink.parse(vendor)
        self.records = records
        self.random = random.Random(seed)
        self.stopping = stop_on_sigterm()
        self.sequence = 0

    @property
    def client(self) -> AsyncClient:
        return self.clients[self.current]

    def fail_over(self) -> None:
        """Move to another replica after it failed to answer."""
        if len(self.clients) > 1:
            self.current = (self.current + self.random.randrange(1, len(self.clients))) % len(
                self.clients
            )

    def next_id(self) -> str:
        self.sequence += 1
        return f"{self.tag}-{self.sequence}"

    def error(self, error: TollgateError) -> None:
        self.records.count("error", error.code)
        if isinstance(error, (ServerUnreachable, StoreUnavailable)):
            self.fail_over()

    async def backoff(self, seconds: float) -> None:
        await asyncio.sleep(seconds * (0.5 + self.random.random()))

    async def acquire(
        self, limits: str | list[str], priority: str, wait: float
    ) -> AsyncPermit | None:
        """A permit, or None after counting the denial or error and backing off."""
        try:
            return await self.client.acquire(limits, priority=priority, wait=wait)
        except RateLimited as denied:
            self.records.count("deny", denied.reason or "unknown")
            await self.backoff(min(denied.retry_after or 0.05, 0.2))
        except TollgateError as error:
            self.error(error)
            await self.backoff(0.1)
        return None

    # ---- rate -------------------------------------------------------------------------------

    async def rate_loop(self) -> None:
        while not self.stopping[0]:
            limits = list(self.random.choice(RATE_REQUESTS))
            priority = self.random.choice(PRIORITIES)
            # Waits well under the limits' windows (1 s and more): a grant that waited is
            # bracketed by a span the oracle can still place in one window.
            wait = self.random.choice((0.0, 0.0, 0.0, 0.3, 0.5))
            sent = now_us()
            permit = await self.acquire(limits, priority, wait)
            if permit is None:
                continue
            received = now_us()
            self.records.count("grant")
            call = self.next_id()
            self.records.line(
                f"g {call} {','.join(limits)} {priority} {int(wait * 1000)} {sent} {received}"
            )
            await asyncio.gather(
                *(self.vendor.send("/call", {"l": limit, "id": call}) for limit in limits)
            )
            try:
                await permit.commit()
            except TollgateError as error:
                self.error(error)

    # ---- leases -----------------------------------------------------------------------------

    async def holder_loop(self, limit: str) -> None:
        ttl_us = concurrency_limit(limit).lease_ttl_ms * 1_000
        while not self.stopping[0]:
            priority = self.random.choice(PRIORITIES)
            sent = now_us()
            permit = await self.acquire(limit, priority, 1.0)
            if permit is None:
                continue
            received = now_us()
            self.records.count("grant")
            lease = self.next_id()
            fence = permit.fence or 0
            self.records.line(f"L {lease} {limit} {priority} {fence} {sent} {received}")
            await self.work_under(permit, lease, limit, fence, ttl_us, sent, received)

    async def work_under(
        self,
        permit: AsyncPermit,
        lease: str,
        limit: str,
        fence: int,
        ttl_us: int,
        sent: int,
        received: int,
    ) -> None:
        # The lease surely lives until `sent + ttl` (it was decided after `sent`) and surely
        # ends by `received + ttl` unless renewed.
        valid_until, expired_by = sent + ttl_us, received + ttl_us
        for segment_number in range(self.random.randint(1, 3)):
            hold_us = int(self.random.uniform(0.1, 0.3) * ttl_us)
            if now_us() + hold_us + SEGMENT_GUARD_US > valid_until:
                break
            segment = f"{lease}.{segment_number}"
            common: dict[str, str | int] = {"l": limit, "id": segment, "p": self.pid, "f": fence}
            await self.vendor.call("/begin", {**common, "u": valid_until})
            await asyncio.sleep(hold_us / 1e6)
            await self.vendor.call("/end", common)
            # Renew: a holder that was stopped past the TTL learns here that it lost the lease.
            renewed = await self.renew(permit, lease, limit, expired_by)
            if renewed is None:
                return
            valid_until, expired_by = renewed[0] + ttl_us, renewed[1] + ttl_us
            if self.stopping[0]:
                break
        await self.release(permit)

    async def renew(
        self, permit: AsyncPermit, lease: str, limit: str, expired_by: int
    ) -> tuple[int, int] | None:
        """Renew through the current replica (another one if it does not answer): the times
        the renewal was sent and answered, or ``None`` when the lease is gone."""
        for _attempt in range(len(self.clients)):
            sent = now_us()
            try:
                await AsyncPermit(self.client, permit.id, permit.limits, permit.cost).renew()
            except (Conflict, NotFound):
                self.records.line(f"r {lease} {limit} refused {sent} {now_us()} {expired_by}")
                self.records.count("renew", "refused")
                return None
            except TollgateError as error:
                self.error(error)
                self.records.line(
                    f"r {lease} {limit} error:{error.code} {sent} {now_us()} {expired_by}"
                )
                if isinstance(error, (ServerUnreachable, StoreUnavailable)):
                    continue
                return None
            received = now_us()
            self.records.line(f"r {lease} {limit} ok {sent} {received} {expired_by}")
            self.records.count("renew", "ok")
            return sent, received
        return None

    async def release(self, permit: AsyncPermit) -> None:
        for _attempt in range(len(self.clients)):
            try:
                await AsyncPermit(self.client, permit.id, permit.limits, permit.cost).release()
                return
            except TollgateError as error:
                self.error(error)
                if not isinstance(error, (ServerUnreachable, StoreUnavailable)):
                    return

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()
        await self.vendor.close()


async def main(
    role: str, tag: str, servers: list[str], vendor: str, records: Path, seed: int, tasks: int
) -> None:
    out = Records(records)
    worker = Worker(tag, servers, vendor, out, seed)
    try:
        if role == "rate":
            loops = [worker.rate_loop() for _ in range(tasks)]
        else:
            # Two of every three tasks on `conc`, the rest on the fenced `mutex`.
            loops = [worker.holder_loop("mutex" if i % 3 == 2 else "conc") for i in range(tasks)]
        await asyncio.gather(*loops)
    finally:
        await worker.close()
        out.close()


if __name__ == "__main__":
    role_, tag_, servers_, vendor_, records_, seed_, tasks_ = sys.argv[1:8]
    asyncio.run(
        main(role_, tag_, servers_.split(","), vendor_, Path(records_), int(seed_), int(tasks_))
    )
