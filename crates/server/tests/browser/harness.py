"""What the browser tests share: a `tollgate serve` of their own, its HTTP API, and headless
Chromium driven through chromedriver.

Environment:
  TOLLGATE_BIN   the `tollgate` binary (required)
  CHROMIUM       the browser (default /usr/bin/chromium)
  CHROMEDRIVER   its driver (default /usr/bin/chromedriver)
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, TypeVar

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

ADMIN_TOKEN = "browser-test-admin-token"
# Generous: the machine is small and shared. Conditions are polled, so a fast run is not slowed.
TIMEOUT_S = 45.0
START_DEADLINE_S = 60.0
WIDTH, HEIGHT = 1280, 800


T = TypeVar("T")


def wait_for(driver: WebDriver, condition: Callable[[WebDriver], T], what: str) -> T:
    """Wait until `condition` returns something truthy (the page re-renders every second, so
    an element read a moment ago may be gone: that is a reason to look again, not a failure)."""
    return WebDriverWait(
        driver, TIMEOUT_S, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    ).until(condition, f"waited {TIMEOUT_S:.0f} s for {what}")


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` (on the server, not the page) until true, failing after TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {TIMEOUT_S:.0f} s for {what}")
        time.sleep(0.2)


class Server:
    """`tollgate serve` on a free loopback port, in a directory of its own (its rules live in
    that directory's tollgate.db), with a known admin token."""

    def __init__(
        self,
        extra_args: list[str] | None = None,
        files: dict[str, str] | None = None,
        data_token: str | None = None,
    ) -> None:
        """`files` are written into the server's directory before it starts."""
        binary = os.environ.get("TOLLGATE_BIN")
        if not binary:
            raise RuntimeError("set TOLLGATE_BIN to the tollgate binary")
        self.dir = Path(tempfile.mkdtemp(prefix="tollgate-ui-"))
        for name, text in (files or {}).items():
            (self.dir / name).write_text(text)
        env = dict(os.environ, TOLLGATE_ADMIN_TOKEN=ADMIN_TOKEN, TOLLGATE_LOG="warn")
        env.pop("TOLLGATE_DATA_TOKEN", None)
        env.pop("TOLLGATE_CONFIG", None)
        self.data_token = data_token
        if data_token:
            env["TOLLGATE_DATA_TOKEN"] = data_token
        self.log = open(self.dir / "server.log", "wb")
        self.process = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--reload-interval-ms", "300",
             *(extra_args or [])],
            cwd=self.dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.url = self._read_address()

    def _read_address(self) -> str:
        """The address the server prints once it listens. Read from the descriptor itself: a
        buffered readline would keep a second line (the gRPC listener's comes first) where
        select cannot see it."""
        assert self.process.stdout is not None
        descriptor = self.process.stdout.fileno()
        deadline = time.monotonic() + START_DEADLINE_S
        pending = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([descriptor], [], [], 0.5)
            if not ready:
                continue
            chunk = os.read(descriptor, 4096)
            if not chunk:
                break
            pending += chunk
            for line in pending.split(b"\n")[:-1]:
                if line.startswith(b"tollgate: listening on "):
                    return line.decode().split(" on ", 1)[1].strip()
        log = self.read_log()
        self.stop()
        raise RuntimeError(f"the server did not start: {pending!r}; log:\n{log}")

    def read_log(self) -> str:
        return (self.dir / "server.log").read_text(errors="replace")

    def call(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        """One API call: (status, parsed JSON body)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        token = token or self.data_token
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.call(method, path, body, token=ADMIN_TOKEN)

    def put_limit(self, name: str, rule: dict[str, Any]) -> dict[str, Any]:
        status, answer = self.admin("PUT", f"/v1/limits/{name}", rule)
        assert status == 200, answer
        return answer

    def acquire(self, limit: str, key: str | None = None, cost: int = 1) -> int:
        body: dict[str, Any] = {"limits": [limit], "cost": cost}
        if key is not None:
            body["key"] = key
        status, _ = self.call("POST", "/v1/acquire", body)
        return status

    def insert_row(self, **columns: Any) -> None:
        """A row written straight into the rules table, as an administrator with SQL would;
        the server picks it up at its next reload."""
        names = ", ".join(columns)
        marks = ", ".join("?" for _ in columns)
        with sqlite3.connect(self.dir / "tollgate.db", timeout=30) as db:
            db.execute(f"INSERT INTO tollgate_limits ({names}) VALUES ({marks})",
                       list(columns.values()))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def chromium() -> webdriver.Chrome:
    """Headless Chromium at 1280x800 with its console log readable through get_log."""
    profile = tempfile.mkdtemp(prefix="tollgate-ui-chromium-")
    options = Options()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        f"--window-size={WIDTH},{HEIGHT}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver is named, so Selenium never tries to fetch one.
    service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.profile_dir = profile  # type: ignore[attr-defined]
    # The window size counts the browser's own frame: grow the window until the page itself
    # (and so a screenshot) is WIDTH x HEIGHT.
    inner_width, inner_height = driver.execute_script(
        "return [window.innerWidth, window.innerHeight]"
    )
    driver.set_window_size(2 * WIDTH - inner_width, 2 * HEIGHT - inner_height)
    return driver


def quit_chromium(driver: webdriver.Chrome) -> None:
    profile = getattr(driver, "profile_dir", None)
    driver.quit()
    if profile:
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """The SEVERE entries of the browser's console since the last call (reading drains)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
