"""The status page names how the replicas meet (issue 36): a DiLoCo job's page says so, and counts
its committed steps as syncs; in a real headless Chromium against a live controller process."""

from __future__ import annotations

import pytest

from tests.ui.test_status_page import browser, in_browser  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


async def test_a_diloco_job_shows_its_mode_and_counts_syncs(controller_process, browser):  # noqa: F811
    ctl = controller_process("--job-id", "semi", "--replicas", "2", "--sync-mode", "diloco", "--sync-every", "8",
                             "--event-log", "off")
    await in_browser(browser.open, f"{ctl.http}/ui")
    await in_browser(browser.wait_for, "document.getElementById('sync-mode')?.dataset.mode === 'diloco'", 30,
                     "the page to show the job's mode")
    text = {k: await in_browser(browser.evaluate, f"document.getElementById('{k}').textContent")
            for k in ("sync-mode", "committed-label", "step-rate-label")}
    assert text == {"sync-mode": "diloco: a sync every 8 inner steps", "committed-label": "committed sync",
                    "step-rate-label": "syncs / s"}
