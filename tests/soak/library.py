"""A library worker: runs `tollgate-fleet-worker` (the engine straight on Redis, no server),
optionally under libfaketime with its clock skewed, reads the grant it prints for each permit
(decided on the store's clock) and calls the mock vendor under each one.

Records (see ``common.Records``):

    G ID LIMIT DECIDED READ      a grant decided at DECIDED (store clock), read here at READ
    c SECOND KIND DETAIL COUNT   grants and errors (by code) per second

SIGTERM kills the fleet worker with SIGKILL (it holds no lease) and ends this process.

Usage: library.py TAG BINARY URL LIMIT_NAME LIMIT PERIOD_MS ALGORITHM ACQUIRERS DURATION_MS
       VENDOR RECORDS SKEW FAKETIME_LIBRARY      (SKEW and FAKETIME_LIBRARY "-" for none)
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from common import NAMESPACE, Records, VendorLink, now_us

#: The engine's error messages (`tollgate::Error`'s Display) by the server's wire code.
ERROR_CODES = (
    ("store unavailable", "store_unavailable"),
    ("too many keys", "too_many_keys"),
    ("unknown limit", "not_found"),
    ("permit:", "conflict"),
    ("the limiter is shutting down", "store_unavailable"),
)


def error_code(message: str) -> str:
    return next((code for prefix, code in ERROR_CODES if message.startswith(prefix)), "other")


async def main(argv: list[str]) -> None:
    (tag, binary, url, limit_name, limit, period_ms, algorithm, acquirers, duration_ms) = argv[:9]
    vendor_url, records_path, skew, faketime = argv[9:13]
    records = Records(Path(records_path))
    environment = dict(os.environ)
    if skew != "-":
        environment.update({"LD_PRELOAD": faketime, "FAKETIME": skew, "FAKETIME_DONT_RESET": "1"})
    child = await asyncio.create_subprocess_exec(
        binary,
        url,
        NAMESPACE,
        limit_name,
        limit,
        period_ms,
        acquirers,
        duration_ms,
        algorithm,
        stdout=asyncio.subprocess.PIPE,
        env=environment,
    )
    loop = asyncio.get_running_loop()
    for stop in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(stop, child.kill)
    vendor = VendorLink.parse(vendor_url)
    await vendor.connect()
    calls: list[asyncio.Future[int]] = []
    sequence = 0
    assert child.stdout is not None
    while line := await child.stdout.readline():
        read = now_us()
        words = line.decode().split()
        if not words:
            continue
        if words[0] == "grant":
            decided, limit_of_grant = words[1], words[3]
            sequence += 1
            call = f"{tag}-{sequence}"
            calls.append(vendor.send("/call", {"l": limit_of_grant, "id": call}))
            records.line(f"G {call} {limit_of_grant} {decided} {read}")
            records.count("grant")
            if len(calls) > 1000:
                await asyncio.gather(*calls, return_exceptions=True)
                calls.clear()
        elif words[0] == "error":
            records.count("error", error_code(line.decode()[len("error ") :]))
    await child.wait()
    await asyncio.gather(*calls, return_exceptions=True)
    await vendor.close()
    records.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
