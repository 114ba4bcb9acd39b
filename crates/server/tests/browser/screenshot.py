"""Takes the dashboard's picture for the documentation (docs/images/dashboard.png): a server with
a few example limits under a couple of minutes of changing traffic, one limit paused, the
admin token entered and one limit opened.

    TOLLGATE_BIN=target/debug/tollgate crates/server/tests/browser/.venv/bin/python \\
        crates/server/tests/browser/screenshot.py docs/images/dashboard.png [SECONDS]
"""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import harness


def traffic(server: harness.Server, seconds: float, stop: threading.Event) -> None:
    """Acquires at a rate that rises and falls, leases held a while, a few keys."""
    started = time.monotonic()
    leases: list[tuple[float, str]] = []
    tick = 0
    while not stop.is_set() and time.monotonic() - started < seconds:
        elapsed = time.monotonic() - started
        wave = 0.5 + 0.5 * math.sin(elapsed / 20)
        for _ in range(int(2 + 10 * wave)):
            server.acquire("vendor-x")
        if tick % 2 == 0:
            server.acquire("search", cost=3)
        status, answer = server.call("POST", "/v1/acquire", {"limits": ["exports"]})
        if status == 200:
            leases.append((time.monotonic() + 3 + 4 * wave, answer["permit"]))
        for due, permit in [lease for lease in leases if lease[0] <= time.monotonic()]:
            server.call("POST", f"/v1/permits/{permit}/commit", {"used": 1})
            leases.remove((due, permit))
        server.acquire("entity-bundle", key=f"user-{tick % 7}")
        tick += 1
        time.sleep(0.5)


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "dashboard.png")
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 150.0
    server = harness.Server()
    driver = None
    stop = threading.Event()
    try:
        server.put_limit("vendor-x", {"kind": "rate", "limit": 600, "period_ms": 60000,
                                      "reserve": {"high": 100}})
        server.put_limit("search", {"kind": "rate", "limit": 20, "period_ms": 1000,
                                    "algorithm": "gcra", "burst": 40})
        server.put_limit("exports", {"kind": "concurrency", "limit": 5, "lease_ttl_ms": 30000})
        server.put_limit("entity-bundle", {"kind": "rate", "limit": 3, "period_ms": 60000,
                                           "algorithm": "fixed", "per": "user",
                                           "match": {"method": "GET",
                                                     "path": "/repo/v1/entity/#/bundle"}})
        server.put_limit("payments", {"kind": "rate", "limit": 100, "period_ms": 60000})
        server.call("POST", "/v1/pause", {"limit": "payments", "retry_after_ms": 600000})
        driver = harness.chromium()
        driver.get(server.url + "/ui")
        worker = threading.Thread(target=traffic, args=(server, seconds, stop))
        worker.start()
        worker.join()
        wait = WebDriverWait(driver, 60)
        driver.find_element(By.ID, "admin-token").send_keys(harness.ADMIN_TOKEN)
        driver.find_element(By.CSS_SELECTOR, "#token-form button").click()
        wait.until(lambda d: d.find_element(By.ID, "admin-on").is_displayed())
        driver.find_element(By.CSS_SELECTOR, 'tr[data-limit="vendor-x"] button.link').click()
        wait.until(lambda d: d.find_element(By.ID, "detail").is_displayed())
        driver.execute_script("window.scrollTo(0, 0)")
        time.sleep(1.5)  # one more poll, so that the picture shows rates of the last seconds
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
        print(f"saved {out} ({harness.png_size(out)[0]}x{harness.png_size(out)[1]})")
    finally:
        stop.set()
        if driver is not None:
            harness.quit_chromium(driver)
        server.stop()


if __name__ == "__main__":
    main()
