"""The dashboard in a real browser: `qlm serve` runs as a process (emulated engines), Debian's
chromium loads /dashboard headless through Selenium and chromedriver, shows the attainment that
/metrics reports and the late requests with their causes, and updates without a reload when
more requests complete; a screenshot of the page is kept in the test's directory."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.metrics.plane import run_requests, sample_sums, serve_fleet
from tests.metrics.tools import binary
from tests.redis_server import free_port, stop_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def base_url(tmp_path: Path) -> Iterator[str]:
    """`qlm serve` on a free port, stopped after the test."""
    port = free_port()
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump(serve_fleet(port)))
    qlm = Path(sys.executable).parent / "qlm"
    log = (tmp_path / "qlm.log").open("wb")
    process = subprocess.Popen(
        [str(qlm), "serve", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, tmp_path / "qlm.log")
        yield url
    finally:
        stop_process(process, grace_s=20)


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"qlm serve did not come up:\n{log.read_text()[-3000:]}")


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = binary("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(binary("chromedriver")))
    try:
        yield driver
    finally:
        driver.quit()


def metrics_attainment(url: str) -> tuple[int, int]:
    text = httpx.get(f"{url}/metrics").text
    met = sample_sums(text, "qlm_slo_met_total", "slo_class")
    evaluated = sample_sums(text, "qlm_slo_evaluated_total", "slo_class")
    return int(met["interactive"]), int(evaluated["interactive"])


def metrics_misses(url: str) -> list[tuple[str, str]]:
    """(cause, count) of the missed requests /metrics reports, causes with none left out."""
    text = httpx.get(f"{url}/metrics").text
    missed = sample_sums(text, "qlm_slo_missed_total", "cause")
    return sorted((cause, str(int(n))) for cause, n in missed.items() if n)


def shown_misses(driver: WebDriver, slo_class: str) -> list[tuple[str, str]]:
    rows = driver.find_elements(By.CSS_SELECTOR, f'#misses tbody tr[data-class="{slo_class}"]')
    cells = [(r.get_attribute("data-cause"), r.find_elements(By.TAG_NAME, "td")) for r in rows]
    return sorted((str(cause), tds[2].text) for cause, tds in cells)


def shown_late(driver: WebDriver) -> list[str]:
    """The causes of the rows of the late-requests table, newest first."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#late tbody tr[data-request]")
    return [str(r.get_attribute("data-cause")) for r in rows]


def card(driver: WebDriver, slo_class: str) -> dict[str, str]:
    element = driver.find_element(By.CSS_SELECTOR, f'.card[data-class="{slo_class}"]')
    fields = element.find_elements(By.CSS_SELECTOR, "[data-field]")
    return {f.get_attribute("data-field") or "": f.text for f in fields}


def shows(driver: WebDriver, met: int, evaluated: int) -> bool:
    try:
        figures = card(driver, "interactive")
    except Exception:
        return False
    expected = {
        "met": str(met),
        "evaluated": str(evaluated),
        "ratio": f"{100 * met / evaluated:.1f}%",
    }
    return all(figures.get(k) == v for k, v in expected.items())


def test_dashboard_shows_the_attainment_of_metrics_and_updates(
    base_url: str, browser: WebDriver, tmp_path: Path
) -> None:
    run_requests(base_url, n_ok=3, n_late=1)
    met, evaluated = metrics_attainment(base_url)
    assert (met, evaluated) == (3, 4)

    browser.get(f"{base_url}/dashboard")
    # the page re-renders as it polls: an element read mid-render is read again
    wait = WebDriverWait(
        browser, 15, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    )
    wait.until(lambda d: d.find_element(By.ID, "status").text == "live")
    wait.until(lambda d: shows(d, met, evaluated))
    assert card(browser, "batch-2")["ratio"] == "–"  # nothing judged yet

    rows = browser.find_elements(By.CSS_SELECTOR, "#instances tbody tr")
    assert {r.get_attribute("data-instance") for r in rows} == {"gpu-0", "gpu-1"}
    assert all("ready" in r.text and "m-a" in r.text for r in rows)
    reuse = [r.find_element(By.CSS_SELECTOR, "td.prefix-reuse").text for r in rows]
    assert all(text == "–" or text.endswith("%") for text in reuse), reuse
    chart = '#attainment-chart path[data-class="interactive"]'
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, chart))
    assert browser.find_elements(By.CSS_SELECTOR, "#waits tbody tr")
    misses = metrics_misses(base_url)
    assert sum(int(n) for _, n in misses) == 1  # the late one, under its cause
    wait.until(lambda d: shown_misses(d, "interactive") == misses)
    wait.until(lambda d: shown_late(d) == [misses[0][0]])  # the late one, with its cause

    generated = browser.find_element(By.TAG_NAME, "body").get_attribute("data-generated-at")
    run_requests(base_url, n_ok=1, n_late=2)  # now 4 of 7
    met, evaluated = metrics_attainment(base_url)
    assert (met, evaluated) == (4, 7)
    wait.until(lambda d: shows(d, met, evaluated))  # no reload: the page polls
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-generated-at") != generated
    causes = [cause for cause, n in metrics_misses(base_url) for _ in range(int(n))]
    wait.until(lambda d: sorted(shown_late(d)) == sorted(causes))
    late_row = browser.find_element(By.CSS_SELECTOR, "#late tbody tr").text
    assert "m-a" in late_row, late_row
    assert "interactive" in late_row, late_row
    browser.set_window_size(1280, 2400)  # the whole page, late requests included
    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG"), shot

    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert resources
    assert all(str(r).startswith(base_url) for r in resources), resources
    errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert not errors, errors
