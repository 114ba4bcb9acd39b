"""The dashboard at /ui in headless Chromium, against a real `tollgate serve`: it loads with no
console errors, shows every limit and the server's state, its numbers follow the traffic, an
operator with the admin token edits and pauses limits (and sees the server's own message when
an edit is refused), and names, keys and reasons are shown as text, never as markup."""

from __future__ import annotations

import threading

from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

import harness
from conftest import OUT
from harness import wait_for

MARKUP = "<img src=x onerror=alert(1)>"


# ---- Helpers ------------------------------------------------------------------------------


def text(driver: WebDriver, selector: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, selector).text


def cell(driver: WebDriver, limit: str, column: str) -> str:
    """The text of one cell of a limit's row: column is a class of the cell or its index."""
    row = f'tr[data-limit="{limit}"]'
    if column.isdigit():
        return text(driver, f"{row} td:nth-child({int(column) + 1})")
    return text(driver, f"{row} td.{column}")


def shown(driver: WebDriver, element_id: str) -> bool:
    return driver.find_element(By.ID, element_id).is_displayed()


def unlock(driver: WebDriver, token: str = harness.ADMIN_TOKEN) -> None:
    field = driver.find_element(By.ID, "admin-token")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()


def open_limit(driver: WebDriver, name: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'tr[data-limit="{name}"] button.link').click()
    wait_for(driver, lambda d: d.find_element(By.ID, "detail-title").text == name,
             f"the detail panel of {name}")


def set_field(element: WebElement, value: str) -> None:
    element.clear()
    element.send_keys(value)


def no_alert(driver: WebDriver) -> bool:
    try:
        driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


# ---- Tests --------------------------------------------------------------------------------


def test_page_loads_with_every_limit_its_policy_and_no_console_error(
    page: WebDriver, server: harness.Server
) -> None:
    wait_for(page, lambda d: text(d, "#ready-rules") == "ok" and text(d, "#ready-store") == "ok",
             "readiness from /readyz")
    wait_for(page, lambda d: text(d, "#status").startswith("live"), "a first poll")
    assert cell(page, "vendor-x", "policy").startswith("10 per 1 min")
    assert "2 kept for high" in cell(page, "vendor-x", "policy")
    assert cell(page, "exports", "policy") == "5 at once, lease 30 s"
    assert "per user" in cell(page, "per-user", "policy")
    # A per-key limit has no one counter to show until a key is chosen.
    assert cell(page, "per-user", "used").startswith("per user")
    wait_for(page, lambda d: cell(d, "vendor-x", "used") == "0 / 10", "vendor-x's usage")
    assert text(page, "#rules-source") == "table tollgate_limits"
    assert text(page, "#rules-reload") == "ok"
    assert text(page, "#store-kind") == "memory"
    assert text(page, "#store-keys").endswith("(cap 1,000,000)")
    assert not page.find_element(By.ID, "rejected").is_displayed()
    # Without the admin token the page is read-only.
    assert shown(page, "read-only-badge")
    open_limit(page, "vendor-x")
    assert shown(page, "read-only")
    for hidden in ("actions", "pause-form", "new-limit", "admin-on", "editor"):
        assert not shown(page, hidden), hidden
    # A few more polls, then the console: nothing went wrong loading or refreshing.
    version = text(page, "#status")
    wait_for(page, lambda d: text(d, "#status") != version, "another poll")
    assert harness.console_errors(page) == []


def test_numbers_follow_acquires_denials_and_waiters(
    page: WebDriver, server: harness.Server
) -> None:
    server.put_limit("moving", {"kind": "rate", "limit": 10, "period_ms": 60000})
    server.put_limit("queue", {"kind": "rate", "limit": 1, "period_ms": 20000})
    wait_for(page, lambda d: cell(d, "moving", "used") == "0 / 10", "a limit created meanwhile")

    for _ in range(4):
        assert server.acquire("moving") == 200
    wait_for(page, lambda d: cell(d, "moving", "used") == "4 / 10", "the usage after 4 acquires")
    wait_for(page, lambda d: cell(d, "moving", "3") not in ("0", "…"), "grants per second")
    points = page.find_element(By.CSS_SELECTOR, 'tr[data-limit="moving"] .line-used')
    assert points.get_attribute("points"), "the sparkline draws the usage"

    statuses = [server.acquire("moving") for _ in range(7)]
    assert statuses.count(429) >= 1, statuses
    wait_for(page, lambda d: cell(d, "moving", "used") == "10 / 10", "a full limit")
    wait_for(page, lambda d: cell(d, "moving", "4") not in ("0", "…"), "denials per second")

    # One acquire waits for room on `queue` (up to its 20 s period): the page counts it.
    assert server.acquire("queue") == 200
    waiter = threading.Thread(
        target=server.call,
        args=("POST", "/v1/acquire", {"limits": ["queue"], "wait_ms": 30000}),
    )
    waiter.start()
    try:
        wait_for(page, lambda d: cell(d, "queue", "5") == "1", "a waiter")
        assert text(page, "#total-waiting") == "1"
    finally:
        waiter.join(60)
    wait_for(page, lambda d: cell(d, "queue", "5") == "0", "the waiter served")
    assert harness.console_errors(page) == []


def test_admin_edit_applies_and_a_refused_edit_shows_the_servers_message(
    page: WebDriver, server: harness.Server
) -> None:
    unlock(page, "not-the-token")
    wait_for(page, lambda d: "not accepted" in text(d, "#token-message"), "the refusal")
    assert "refuses this token" in text(page, "#token-message")
    assert shown(page, "read-only-badge")

    unlock(page)
    wait_for(page, lambda d: shown(d, "admin-on"), "admin mode")
    assert not shown(page, "token-message")
    # The token is kept in this tab's sessionStorage only: never in the URL, a cookie or
    # localStorage.
    assert harness.ADMIN_TOKEN not in page.current_url
    assert page.execute_script("return document.cookie") == ""
    assert page.execute_script("return localStorage.length") == 0
    assert harness.ADMIN_TOKEN in page.execute_script(
        "return Object.values(sessionStorage).join(' ')"
    )

    open_limit(page, "vendor-x")
    assert not shown(page, "read-only") and not shown(page, "read-only-badge")
    page.find_element(By.ID, "edit").click()
    wait_for(page, lambda d: shown(d, "editor"), "the editor")
    limit = page.find_element(By.CSS_SELECTOR, '#edit-form [name="limit"]')
    assert limit.get_attribute("value") == "10"
    set_field(limit, "25")
    page.find_element(By.CSS_SELECTOR, "#edit-form button[type=submit]").click()
    wait_for(page, lambda d: text(d, "#edit-message").startswith("Saved"), "the save")
    wait_for(page, lambda d: cell(d, "vendor-x", "used").endswith("/ 25"), "the new limit")
    status, rule = server.admin("GET", "/v1/limits/vendor-x")
    assert status == 200 and rule["limit"] == 25 and rule["reserve"] == {"high": 2}, rule

    # A zero limit: the server refuses it, and the page shows the server's own words.
    set_field(limit, "0")
    page.find_element(By.CSS_SELECTOR, "#edit-form button[type=submit]").click()
    status, refusal = server.admin("PUT", "/v1/limits/vendor-x", {
        "kind": "rate", "limit": 0, "period_ms": 60000, "algorithm": "sliding",
        "reserve": {"high": 2},
    })
    assert status == 400 and refusal["error"]["field"] == "limit", refusal
    expected = refusal["error"]["message"]
    assert "limit" in expected
    wait_for(page, lambda d: text(d, "#edit-message") == expected, "the server's message")
    assert limit.get_attribute("aria-invalid") == "true"
    assert server.admin("GET", "/v1/limits/vendor-x")[1]["limit"] == 25

    # The console holds only the browser's note of the refused request.
    unexpected = [
        message for message in harness.console_errors(page)
        if not ("/v1/limits" in message and ("400" in message or "401" in message))
    ]
    assert unexpected == []


def test_admin_pauses_a_limit_and_the_page_shows_its_end(
    page: WebDriver, server: harness.Server
) -> None:
    server.put_limit("pausable", {"kind": "rate", "limit": 5, "period_ms": 1000})
    wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-limit="pausable"]'),
             "the new limit")
    assert cell(page, "pausable", "paused") == "—"
    unlock(page)
    wait_for(page, lambda d: shown(d, "admin-on"), "admin mode")
    open_limit(page, "pausable")
    wait_for(page, lambda d: shown(d, "pause-form"), "the pause form")
    assert "Resume lifts one at once" in text(page, "#pause-form")
    set_field(page.find_element(By.ID, "pause-seconds"), "120")
    page.find_element(By.CSS_SELECTOR, "#pause-form button[type=submit]").click()
    wait_for(page, lambda d: text(d, "#pause-message").startswith("Paused until"),
             "the pause's answer")
    wait_for(page, lambda d: cell(d, "pausable", "paused").startswith("until "),
             "the pause in the table")
    status, stats = server.call("GET", "/v1/stats?limit=pausable")
    assert status == 200 and stats["limits"][0]["usage"]["paused_ms"] > 100000, stats
    assert server.acquire("pausable") == 429
    assert harness.console_errors(page) == []


def test_what_a_vendor_taught_is_shown_with_its_source(
    page: WebDriver, server: harness.Server
) -> None:
    server.put_limit("taught", {"kind": "rate", "limit": 20, "period_ms": 1000})
    status, answer = server.call("POST", "/v1/learn", {
        "limit": "taught", "source": "x-ratelimit-limit from vendor.test",
        "quotas": [{"quota": 10}]})
    assert status == 200 and answer["effective"] == 10, answer
    wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-limit="taught"]'),
             "the new limit")
    open_limit(page, "taught")
    wait_for(page, lambda d: "Learned from the vendor" in text(d, "#detail-stats"),
             "the learned limit")
    shown_text = text(page, "#detail-stats")
    assert "10 of 20 in force, from x-ratelimit-limit from vendor.test" in shown_text, shown_text
    assert harness.console_errors(page) == []


def test_a_key_with_markup_is_shown_as_text(page: WebDriver, server: harness.Server) -> None:
    for _ in range(2):
        assert server.acquire("per-user", key=MARKUP) == 200
    open_limit(page, "per-user")
    assert shown(page, "key-form")
    page.find_element(By.ID, "key-input").send_keys(MARKUP)
    page.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
    wait_for(page, lambda d: text(d, "#chart-caption") == f"Counter of key “{MARKUP}”",
             "the key's counter")
    wait_for(page, lambda d: "2 of 5" in text(d, "#detail-stats"), "the key's usage")
    assert page.find_elements(By.TAG_NAME, "img") == []
    assert no_alert(page)
    # A CSP violation (an inline handler that got through) would be a console error too.
    assert harness.console_errors(page) == []


def test_rejected_rows_show_names_and_reasons_as_text(
    page: WebDriver, server: harness.Server
) -> None:
    bold = '<b id="injected">bold</b>'
    server.insert_row(name="bad-algorithm", kind="rate", limit_units=5, period_ms=1000,
                      algorithm=MARKUP)
    server.insert_row(name=bold, kind="rate", limit_units=5, period_ms=1000)
    wait_for(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#rejected-rows tr")) == 2,
             "two rejected rows")
    assert shown(page, "rejected")
    rows = {
        row.find_element(By.CSS_SELECTOR, "td.name").text:
            row.find_element(By.CSS_SELECTOR, "td.reason").text
        for row in page.find_elements(By.CSS_SELECTOR, "#rejected-rows tr")
    }
    assert MARKUP in rows["bad-algorithm"], rows
    assert bold in rows, rows
    assert page.find_elements(By.TAG_NAME, "img") == []
    assert page.find_elements(By.CSS_SELECTOR, "#injected, #rejected b") == []
    assert no_alert(page)
    assert harness.console_errors(page) == []


def test_limits_from_a_file_cannot_be_edited_but_can_be_paused(driver: WebDriver) -> None:
    limits = '[limits.from-file]\nkind = "rate"\nlimit = 3\nperiod_ms = 1000\n'
    server = harness.Server(["--rules", "file://limits.toml"], files={"limits.toml": limits})
    try:
        driver.get_log("browser")
        driver.get(server.url + "/ui")
        wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-limit="from-file"]'),
                 "the file's limit")
        unlock(driver)
        wait_for(driver, lambda d: shown(d, "admin-on"), "admin mode")
        open_limit(driver, "from-file")
        wait_for(driver, lambda d: shown(d, "file-note"), "the note on the file")
        assert "limits.toml" in text(driver, "#file-note")
        assert not shown(driver, "actions") and not shown(driver, "new-limit")
        assert shown(driver, "pause-form")
        assert harness.console_errors(driver) == []
    finally:
        driver.execute_script("sessionStorage.clear()")
        server.stop()


def test_a_server_with_a_data_token_asks_for_it(driver: WebDriver) -> None:
    server = harness.Server(data_token="browser-test-data-token")
    try:
        server.put_limit("guarded", {"kind": "rate", "limit": 3, "period_ms": 1000})
        driver.get_log("browser")
        driver.get(server.url + "/ui")
        wait_for(driver, lambda d: shown(d, "data-token-form"), "the data token form")
        assert "data token" in text(driver, "#banner-text")
        field = driver.find_element(By.ID, "data-token")
        field.send_keys("browser-test-data-token")
        driver.find_element(By.CSS_SELECTOR, "#data-token-form button[type=submit]").click()
        wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-limit="guarded"]'),
                 "the limits, read with the token")
        wait_for(driver, lambda d: not shown(d, "banner"), "the banner gone")
        assert "browser-test-data-token" not in driver.current_url
        # Only the browser's notes of the refused reads, before the token was given.
        unexpected = [
            message for message in harness.console_errors(driver)
            if not ("/v1/stats" in message and "401" in message)
        ]
        assert unexpected == []
    finally:
        driver.execute_script("sessionStorage.clear()")
        server.stop()


def test_admin_sees_scoped_tokens_without_secrets_and_revokes_one(
    page: WebDriver, server: harness.Server
) -> None:
    status, made = server.admin("POST", "/v1/tokens", {
        "name": "team-a", "limits": ["vendor-*", MARKUP], "priority_max": "low"})
    # A pattern with markup is refused, naming it; the page never sees it.
    assert status == 400 and made["error"]["field"] == "limits[1]", made
    status, made = server.admin("POST", "/v1/tokens", {
        "name": "team-a", "limits": ["vendor-*"], "priority_max": "low"})
    assert status == 201, made
    secret = made["secret"]
    assert not shown(page, "tokens"), "read-only: no tokens panel"
    unlock(page)
    wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "#token-rows tr"), "the tokens")
    row = page.find_element(By.CSS_SELECTOR, "#token-rows tr")
    cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
    assert cells[:4] == ["team-a", "vendor-*", "low", "no"], cells
    assert secret not in page.page_source
    row.find_element(By.TAG_NAME, "button").click()
    page.switch_to.alert.accept()
    wait_for(page, lambda d: shown(d, "no-tokens"), "the token gone")
    assert text(page, "#tokens-message") == "Revoked team-a."
    status, listed = server.admin("GET", "/v1/tokens")
    assert status == 200 and listed["tokens"] == [], listed
    assert harness.console_errors(page) == []


def test_a_page_opened_late_shows_what_came_before_at_once(driver: WebDriver) -> None:
    """Traffic before the page opens is drawn on its first render, from the server's history:
    the rates are numbers, not "…", and the sparkline reaches back before the page."""
    server = harness.Server()
    try:
        server.put_limit("earlier", {"kind": "rate", "limit": 5, "period_ms": 600000})

        def sampled(grants: int) -> bool:
            status, stats = server.call("GET", "/v1/stats?limit=earlier&history=60")
            history = stats["limits"][0].get("history") if status == 200 else None
            return bool(history) and sum(history["grants"]) >= grants and len(history["grants"]) >= 4

        # The server samples every second: first one sample, then the traffic, then more.
        harness.wait_until(lambda: sampled(0), "the first sample")
        for _ in range(5):
            assert server.acquire("earlier") == 200
        assert server.acquire("earlier") == 429
        harness.wait_until(lambda: sampled(5), "the grants in the history")

        driver.get_log("browser")
        opened_ms = driver.execute_script("return Date.now()")
        driver.get(server.url + "/ui")
        wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-limit="earlier"]'),
                 "the limit's row")
        # The first render, with one poll of the page's own: the history did the rest.
        earliest = driver.execute_script("return state.history.get('earlier')[0].t")
        assert earliest < opened_ms - 2000, (earliest, opened_ms)
        points = driver.find_element(
            By.CSS_SELECTOR, 'tr[data-limit="earlier"] .line-used'
        ).get_attribute("points")
        assert points and len(points.split()) >= 3, points
        assert cell(driver, "earlier", "used") == "5 / 5"
        assert harness.console_errors(driver) == []
    finally:
        server.stop()


ENVOY_YAML = """domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: internal
    rate_limit: {name: internal, unlimited: true}
"""


def test_envoy_limits_are_listed_and_a_refused_edit_is_shown(driver: WebDriver) -> None:
    server = harness.Server(
        ["--grpc-listen", "127.0.0.1:0", "--envoy-config", "envoy.yaml"],
        files={"envoy.yaml": ENVOY_YAML},
    )
    try:
        driver.get_log("browser")
        driver.get(server.url + "/ui")
        wait_for(driver, lambda d: shown(d, "envoy"), "the Envoy panel")
        rows = driver.find_elements(By.CSS_SELECTOR, "#envoy-rows tr")
        texts = [row.text for row in rows]
        assert len(texts) == 2, texts
        user = next(t for t in texts if t.startswith("edge.user"))
        assert "5 per minute" in user and "enforced" in user, user
        internal = next(t for t in texts if t.startswith("edge.internal"))
        assert "unlimited" in internal and "internal" in internal, internal
        assert not shown(driver, "envoy-error")
        (server.dir / "envoy.yaml").write_text(ENVOY_YAML.replace("unit: minute", "unit: fortnight"))
        wait_for(driver, lambda d: shown(d, "envoy-error"), "the refused edit")
        assert "fortnight" in text(driver, "#envoy-error")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#envoy-rows tr")) == 2
        assert harness.console_errors(driver) == []
    finally:
        server.stop()


def test_screenshot_at_1280x800(page: WebDriver, server: harness.Server) -> None:
    open_limit(page, "vendor-x")
    wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "#chart .line-used"), "the chart")
    wait_for(page, lambda d: cell(d, "vendor-x", "3") != "…", "rates, from a second poll")
    page.execute_script("window.scrollTo(0, 0)")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "dashboard.png"
    assert page.save_screenshot(str(path))
    assert harness.png_size(path) == (harness.WIDTH, harness.HEIGHT)
    # Usable at that size: nothing is wider than the window.
    assert page.execute_script("return document.documentElement.scrollWidth") <= harness.WIDTH
