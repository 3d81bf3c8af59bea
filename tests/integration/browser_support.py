"""What the console's browser tests share: Debian's Chromium, its flags, and a console page driver."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# A test run leaves the committed screenshots alone unless asked to refresh them.
SHOTS = Path(
    os.environ.get("GPUWARDEN_SCREENSHOT_DIR")
    or Path(tempfile.gettempdir()) / "gpuwarden-console-shots"
).resolve()


def expect(locator: Any) -> Any:
    """Playwright's waiting assertions on ``locator`` (imported late: the module must load, and
    skip, without Playwright)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def _need_browser() -> None:
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        missing.append(f"{CHROMIUM} (scripts/test-services.sh installs it)")
    if missing:
        why = "the console's browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


class Console:
    """One logged-in browser page, collecting console errors and page errors."""

    def __init__(self, browser: Any, base: str, width: int = 1360) -> None:
        self.base = base
        self.context = browser.new_context(viewport={"width": width, "height": 820})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def login(self, token: str) -> None:
        self.page.goto(self.base + "/")
        self.page.wait_for_url("**/login?next=%2F")
        self.page.fill("#token", token)
        self.page.click("#login-form button[type=submit]")
        self.page.wait_for_url(self.base + "/")
        self.ready()
        # The page's own 401 before logging in is expected; nothing else may fail.
        self.errors.clear()

    def open(self, path: str) -> None:
        self.page.goto(self.base + path)
        self.ready()

    def _console(self, message: Any) -> None:
        # A read the service turned away as busy (503 with Retry-After) is asked again by the
        # console; the browser still logs the first answer. Every page must end ready anyway.
        if message.type == "error" and "status of 503" not in message.text:
            self.errors.append(message.text)

    def ready(self) -> None:
        self.page.wait_for_selector("body[data-ready]", timeout=60_000)
        assert self.page.get_attribute("body", "data-ready") == "1", self.page.inner_text("main")

    def shot(self, name: str, *, full_page: bool = False) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full_page)

    def usd(self, selector: str) -> float:
        return float(self.page.get_attribute(selector, "data-usd") or "nan")

    def no_script_ran(self) -> None:
        assert self.page.evaluate("window.__xss") is None
        # Only the console's two script files, no element made from data.
        assert self.page.evaluate("document.querySelectorAll('script').length") == 2
        assert self.page.evaluate("document.querySelectorAll('img').length") == 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()
