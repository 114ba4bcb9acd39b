"""Fixtures of the dashboard's browser tests: one server with a few limits and one headless
Chromium for the module, and a freshly loaded, read-only page for each test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

import harness
from harness import wait_for

OUT = Path(os.environ.get("BROWSER_TEST_OUT", Path(__file__).parent / "out"))


@pytest.fixture(scope="module")
def server() -> Iterator[harness.Server]:
    server = harness.Server()
    server.put_limit("vendor-x", {"kind": "rate", "limit": 10, "period_ms": 60000,
                                  "reserve": {"high": 2}})
    server.put_limit("exports", {"kind": "concurrency", "limit": 5, "lease_ttl_ms": 30000})
    server.put_limit("per-user", {"kind": "rate", "limit": 5, "period_ms": 60000,
                                  "per": "user"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    driver = harness.chromium()
    yield driver
    harness.quit_chromium(driver)


@pytest.fixture
def page(driver: WebDriver, server: harness.Server) -> WebDriver:
    """The dashboard loaded anew, with no token kept from an earlier test, once it shows the
    limits; the console log is drained first, so a test reads only its own entries."""
    driver.get(server.url + "/healthz")  # the same origin, without the page's script
    driver.execute_script("sessionStorage.clear()")
    driver.get_log("browser")
    driver.get(server.url + "/ui")
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-limit="vendor-x"]'),
             "the limits table")
    return driver
