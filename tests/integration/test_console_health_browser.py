"""The console's fleet marks a GPU its hardware slows down and says where memory is not
reported, in Debian's Chromium against the real app (both stores); its own small fleet, so the
demo-fleet tests' counts and widths stay theirs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from tests.integration.browser_support import ARGS, CHROMIUM, Console, _need_browser, expect
from tests.support import FakeClock, auth, make_batch


def test_fleet_marks_a_hardware_slowdown_and_memory_not_reported(
    server: str, tokens: dict[str, str], clock: FakeClock
) -> None:
    _need_browser()
    from playwright.sync_api import sync_playwright

    # An exporter that sends no memory use: one GPU held down by its own hardware (HW thermal
    # slowdown, 0x40), one at its software power cap (0x4: no mark).
    start = clock() - timedelta(seconds=30)
    for uuid, reasons in (("GPU-hot-1", 0x40 | 0x4), ("GPU-capped-2", 0x4)):
        batch = make_batch(gpu_uuids=(uuid,), start=start, count=3,
                           metrics={"gpu_util": 1.0, "clocks_event_reasons": reasons})  # fmt: skip
        r = httpx.post(f"{server}/api/v1/ingest", json=batch, headers=auth(tokens["agent"]))
        assert r.status_code < 300, r.text
    with sync_playwright() as p:
        browser: Any = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            admin = Console(browser, server)
            admin.login(tokens["admin"])
            hot, capped = (f'#fleet tr[data-uuid="{u}"]' for u in ("GPU-hot-1", "GPU-capped-2"))
            expect(admin.page.locator(f"{hot} .chip.hw-slowdown")).to_have_text("HW")
            title = admin.page.get_attribute(f"{hot} .chip.hw-slowdown", "title") or ""
            assert title.startswith("hardware slowdown") and "hw_thermal_slowdown" in title
            assert admin.page.locator(f"{capped} .chip.hw-slowdown").count() == 0
            for row in (hot, capped):
                expect(admin.page.locator(f"{row} .memory-unknown")).to_have_text("not reported")
            assert not admin.errors, admin.errors
        finally:
            browser.close()
