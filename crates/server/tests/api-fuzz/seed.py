"""Limits for scripts/api-fuzz to find in place: the ones the document's examples name, so that
generated requests reach grants, denials and permits, not only "unknown limit".

Usage: seed.py URL ADMIN_TOKEN
"""

from __future__ import annotations

import json
import sys
import urllib.request

LIMITS = {
    # AcquireBody's and PauseBody's example; small, so that 429s come soon.
    "vendor-x": {"kind": "rate", "limit": 5, "period_ms": 1000, "reserve": {"high": 1}},
    # CheckBody's example matches both: a rate per user, and a pool, so a check hands out a
    # permit to commit.
    "entity-bundle": {"kind": "rate", "limit": 3, "period_ms": 1000, "algorithm": "fixed",
                      "per": "user",
                      "match": {"method": "GET", "path": "/repo/v1/entity/#/bundle"}},
    "exports": {"kind": "concurrency", "limit": 2, "lease_ttl_ms": 60000,
                "match": {"method": "*", "path": "/repo/v1/entity/#/bundle"}},
}


def main() -> None:
    url, token = sys.argv[1], sys.argv[2]
    for name, rule in LIMITS.items():
        request = urllib.request.Request(
            f"{url}/v1/limits/{name}", data=json.dumps(rule).encode(), method="PUT",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            if answer.status != 200:
                raise SystemExit(f"seed: PUT {name}: {answer.status} {answer.read()!r}")


if __name__ == "__main__":
    main()
