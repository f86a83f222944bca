"""The status page, Swagger UI and ReDoc in a real headless Chromium, against a live
controller process with a running job (simulated replica leaders over real gRPC)."""

from __future__ import annotations

import asyncio
import json
import struct

import grpc
import httpx
import pytest

from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from tests.ha.cluster import LeaderLog, train
from tests.waiting import wait_for

from .browser import Browser

JOB = "ui"
INJECTED = '<img src=x id=injected onerror="document.title=1">'


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "profile")
    yield b
    b.close()


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


async def in_browser(fn, *args):
    return await asyncio.to_thread(fn, *args)


async def fail_a_commit(stub, http_url: str, replica_id: str, reason: str) -> None:
    """Report a failed commit of the step `replica_id` trains now: a report must name its current
    quorum and step, and its leader keeps moving, so look and try again (bounded) if it moved on."""
    async with httpx.AsyncClient(base_url=http_url, timeout=5) as http:
        for _ in range(100):
            quorum = (await http.get("/api/v1/quorums")).json()["current"]
            step = {r["replica_id"]: r["step"] for r in (await http.get("/api/v1/replicas")).json()}[replica_id]
            try:
                await stub.ReportFailure(pb.ReportFailureRequest(
                    job_id=JOB, replica_id=replica_id, reason=reason, quorum_id=quorum["quorum_id"], step=step,
                    kind=pb.ReportFailureRequest.COMMIT_FAILED))
                return
            except grpc.aio.AioRpcError as exc:
                if "last quorum answer was" not in (exc.details() or ""):
                    raise
    raise AssertionError(f"{replica_id} never held still long enough to fail a commit")


@pytest.mark.slow
async def test_status_page_shows_the_live_job(controller_process, browser, tmp_path):
    ctl = controller_process("--job-id", JOB, "--replicas", "3", "--min-replicas", "1", "--join-timeout-s", "1",
                             "--heartbeat-timeout-s", "5", "--event-log", "off")
    logs = {r: LeaderLog(r) for r in ("r0", "r1", "r2")}
    stops = {r: asyncio.Event() for r in logs}
    tasks = {r: asyncio.ensure_future(train([ctl.grpc], r, logs[r], stops[r], step_s=0.05, job_id=JOB)) for r in logs}
    try:
        await wait_for(lambda: all(len(log.acked_steps) >= 3 for log in logs.values()), 30, "3 steps each")
        tasks["r2"].cancel()
        async with grpc.aio.insecure_channel(ctl.grpc) as channel:
            stub = pbg.ControllerStub(channel)
            await stub.ReportFailure(pb.ReportFailureRequest(job_id=JOB, replica_id="r2", reason="GPU fell off the bus",
                                                             kind=pb.ReportFailureRequest.REPLICA_DEAD))
            await fail_a_commit(stub, ctl.http, "r1", INJECTED)

        await in_browser(browser.open, f"{ctl.http}/ui")
        rows = "[...document.querySelectorAll('#replicas tbody tr')]"
        states = await in_browser(browser.wait_for, f"""(() => {{
            const s = Object.fromEntries({rows}.map(r => [r.dataset.replica, r.dataset.state]));
            return s.r2 === 'DEAD' && s.r0 === 'HEALTHY' && s.r1 === 'HEALTHY' && JSON.stringify(s); }})()""",
                                  30, "three replica rows: r0, r1 HEALTHY and r2 DEAD")
        assert json.loads(states) == {"r0": "HEALTHY", "r1": "HEALTHY", "r2": "DEAD"}
        reason = await in_browser(browser.evaluate, f"{rows}.find(r => r.dataset.replica === 'r2').cells[7].textContent")
        assert reason == "GPU fell off the bus"
        first = int(await in_browser(browser.evaluate, "document.getElementById('committed-step').textContent"))
        assert first >= 2
        # refreshed live: the committed step moves on without a reload, the chart has samples
        await in_browser(browser.wait_for, f"Number(document.getElementById('committed-step').textContent) > {first}"
                                           " && Number(document.body.dataset.refreshed) >= 2", 30, "a live refresh")
        assert int(await in_browser(browser.evaluate, "document.getElementById('chart').dataset.samples")) >= 2
        assert await in_browser(browser.evaluate, "document.querySelectorAll('#chart polyline').length") == 2
        # the chart fills its section, drawn at its own width, with a scale for each line and for time
        chart = json.loads(await in_browser(browser.evaluate, """JSON.stringify((() => {
            const c = document.getElementById('chart');
            const ticks = (k) => [...c.querySelectorAll('text.tick-' + k)].map(t => t.textContent);
            return [c.getBoundingClientRect().width, c.parentElement.getBoundingClientRect().width,
                    c.viewBox.baseVal.width, ticks('step'), ticks('replicas'), ticks('time').length]; })())"""))
        assert chart[0] >= 0.98 * chart[1] and abs(chart[2] - chart[0]) <= 2, chart
        assert chart[3][0] == "0" and len(chart[3]) >= 2 and chart[4] == ["0", "1", "2", "3"] and chart[5] == 3, chart
        assert (await in_browser(browser.evaluate, "document.getElementById('healthy').textContent")) == "2 / 3"
        assert (await in_browser(browser.evaluate, "document.getElementById('sync-mode').textContent")) == \
            "every step (sync)"  # the default mode; tests/ui/test_status_page_sync_mode.py shows another
        assert "%" in await in_browser(browser.evaluate, "document.getElementById('ett').textContent")
        quorum = await in_browser(browser.evaluate, "document.getElementById('quorum').textContent")
        assert "r0, r1" in quorum and "r2" not in quorum
        failures = await in_browser(browser.evaluate, "document.querySelector('#failures tbody tr').textContent")
        assert failures.startswith("r2reported")
        events = await in_browser(browser.evaluate, "document.getElementById('events').textContent")
        assert "GPU fell off the bus" in events and INJECTED in events  # shown as text, never as HTML
        assert await in_browser(browser.evaluate, "document.getElementById('injected')") is None
        # these leaders write no checkpoint: the page says what that risks
        warning = "document.getElementById('checkpoint-warning')"
        assert not await in_browser(browser.evaluate, f"{warning}.hidden")
        assert await in_browser(browser.evaluate, f"{warning}.textContent") == \
            "no durable checkpoint: a failure of every replica restarts from step 0"
        shot = await in_browser(browser.screenshot, tmp_path / "status-page.png")
        width, height = png_size(shot.read_bytes())
        assert width >= 1000 and height >= 600

        for path, ready in (("/docs", "document.querySelector('.swagger-ui .info .title')?.textContent"),
                            ("/redoc", "document.querySelector('.redoc-wrap h1')?.textContent")):
            await in_browser(browser.open, f"{ctl.http}{path}")
            title = await in_browser(browser.wait_for, ready, 30, f"{path} to render")
            assert "fthsdp controller" in title
        # the documentation pages carry a policy that refuses anything not served by the controller;
        # whatever external image ReDoc's bundle shows (its logo, depending on the build) is refused
        async with httpx.AsyncClient() as http:
            for path in ("/docs", "/redoc"):
                policy = (await http.get(f"{ctl.http}{path}")).headers["content-security-policy"]
                assert "default-src 'self'" in policy, (path, policy)
        external = await in_browser(browser.evaluate,
                                    "JSON.stringify([...document.images].map(i => i.src).filter(u => /^https?:/.test(u) && !u.startsWith(location.origin)))")
        for src in json.loads(external):
            await wait_for(lambda: src in browser.blocked_urls(), 10, f"the page's policy to block {src}")
        # everything the three pages loaded came from the controller itself: no CDN
        urls = browser.requested_urls()
        assert any(u.endswith("/ui/vendor/swagger-ui-bundle.js") for u in urls)
        assert any(u.endswith("/ui/vendor/redoc.standalone.js") for u in urls)
        local = (ctl.http, f"blob:{ctl.http}", "data:", "about:")
        assert [u for u in urls if not u.startswith(local)] == []
    finally:
        for r in logs:
            stops[r].set()
            tasks[r].cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
