"""The status page in a real headless Chromium after a host is killed, and after the job ended: a real controller, real
agents and their trainers (scripted replica leaders that join quorums and commit), the agent
of one host and its trainer killed with SIGKILL. Checked by DOM queries: the hosts table shows
the dead host, the job card the job's state and reason, the stall the survivors stood through
and the failure beside it; the words read once and quorum ids are short. One screenshot is
kept as a test artifact: test-artifacts/ui/status-page-after-host-kill.png (gitignored;
FTHSDP_TEST_ARTIFACTS moves the folder)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from tests.agent.cluster import Cluster
from tests.agent.helpers import alive, trainer_command, wait_for, wait_for_async

from .browser import Browser
from .test_status_page import in_browser, png_size

pytestmark = pytest.mark.slow
BOUND_S = 60
#: Every word said twice in a row in a line of the page's text ("replica replica r1").
DOUBLED = r"JSON.stringify([...document.body.innerText.matchAll(/\b([A-Za-z]{2,}) +\1\b/gi)].map(m => m[0]))"
ARTIFACTS = Path(os.environ.get("FTHSDP_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))


@pytest.fixture
async def cluster(tmp_path):
    # A round waits 2 s for a replica that stopped joining, and its host is declared dead after
    # 3 s of silence: the survivors stand still for a while, as they would in a real job.
    c = Cluster(tmp_path, heartbeat_timeout_s=3.0)
    await c.start_controller(3, 0, "--join-timeout-s", "2.0", "--job-id", "job")
    yield c
    await c.close()


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "profile")
    yield b
    b.close()


async def committed_past(c: Cluster, step: int, *replicas: str) -> int:
    async def check():
        views = {r["replica_id"]: r for r in await c.get("/api/v1/replicas")}
        ok = all(views.get(r, {}).get("state") == "HEALTHY" and views[r]["committed_step"] > step for r in replicas)
        return ok and max(views[r]["committed_step"] for r in replicas)
    return await wait_for_async(check, BOUND_S, f"{replicas} HEALTHY past step {step}")


async def test_the_page_shows_a_killed_host_the_job_and_the_stall(cluster, browser):
    c = cluster
    for i, replica in enumerate(("r0", "r1", "r2"), start=1):
        await c.start_agent(f"h{i}", replica=replica)
    await c.start_agent("h4", spare=True, standby=True)
    step = await committed_past(c, 3, "r0", "r1", "r2")
    await in_browser(browser.open, f"{c.http}/ui")
    await in_browser(browser.wait_for, """(() => { const r = document.querySelector('#hosts tr[data-host="h4"]');
        return r && r.dataset.state === 'SPARE' && r.cells[2].textContent === 'spare, standby trainers'; })()""",
                     BOUND_S, "h4 a spare with standby trainers")

    # Kill host h1: its agent and its trainer, with SIGKILL (nothing says goodbye).
    agent = next(p for p in c.procs if p.name == "h1")
    trainers = c.trainers("r0")
    os.kill(agent.pid, signal.SIGKILL)
    for t in trainers:
        with contextlib.suppress(ProcessLookupError):  # it may have gone with its agent already
            os.kill(t["pid"], signal.SIGKILL)
    await wait_for(lambda: not any(alive(t["pid"]) for t in trainers), BOUND_S, "h1's trainer gone")
    await wait_for_async(lambda: c.events("host_death"), BOUND_S, "h1 declared dead")
    # r0 comes back on the spare h4 and the job trains on with all three
    await committed_past(c, step + 3, "r0", "r1", "r2")
    stalls = await c.get("/api/v1/stalls")
    assert stalls["stalls"], stalls

    # the page refreshes by itself: the hosts table shows h1 dead (and why), h4 took r0 over
    hosts = await in_browser(browser.wait_for, """(() => {
        const rows = [...document.querySelectorAll('#hosts tbody tr')];
        const h = Object.fromEntries(rows.map(r => [r.dataset.host, [...r.cells].map(c => c.textContent)]));
        return h.h1 && h.h1[1] === 'DEAD' && h.h4 && h.h4[3].startsWith('replica r0') && JSON.stringify(h); })()""",
                                  BOUND_S, "h1 DEAD and h4 running r0 in the hosts table")
    hosts = json.loads(hosts)
    assert set(hosts) == {"h1", "h2", "h3", "h4"}
    assert hosts["h1"][4].startswith("yes (failure)") and "died" in hosts["h1"][6]  # cordoned after the failure, and why
    assert hosts["h2"][1] == "ACTIVE" and hosts["h2"][2] == "active" and hosts["h2"][3] == "replica r1, ranks 0 of 1"
    assert float(hosts["h1"][5]) >= 3.0  # last seen before the heartbeat timeout
    # the job card
    assert await in_browser(browser.evaluate, "document.getElementById('job-card').dataset.state") == "RUNNING"
    reason = await in_browser(browser.evaluate, "document.getElementById('job-reason').textContent")
    assert reason.startswith("training: ") and "replicas healthy" in reason
    # the stall: in the stalls table with the failure in it, and beside the failure's recovery
    stall = json.loads(await in_browser(browser.wait_for, """(() => {
        const s = [...document.querySelectorAll('#stalls tbody tr')].find(r => (r.cells[3]?.textContent || '').includes('r0'));
        const f = document.querySelector('#failures tbody tr[data-replica="r0"]');
        return s && f && JSON.stringify({stall: [...s.cells].map(c => c.textContent), seconds: Number(s.dataset.seconds),
                                          failure: [...f.cells].map(c => c.textContent), beside: Number(f.dataset.stall)}); })()""",
                                           BOUND_S, "a stall with r0's failure in it"))
    assert stall["seconds"] >= 1.0 and stall["beside"] >= stall["seconds"]
    # r0's death is detected by its host's heartbeat timeout or by its own (both 3 s after the
    # kill; whichever ends first): the page shows the cause the API recorded
    causes = [f["cause"] for f in (await c.get("/api/v1/stalls"))["failures"] if f["replica"] == "r0"]
    assert causes and causes[-1] in ("host", "heartbeat"), causes
    assert stall["failure"][1] == causes[-1] and float(stall["failure"][5]) == pytest.approx(stall["beside"], abs=0.051)
    # the quorum the job went on with, its id short (on failure: what the API said, to tell why)
    assert stall["stall"][4].startswith("quorum …"), (stall, await c.get("/api/v1/stalls"),
                                                      await c.get("/api/v1/quorums"), await c.get("/api/v1/history"))
    # the chart shades it
    assert await in_browser(browser.evaluate, "document.querySelectorAll('#chart rect.stall').length") >= 1
    # quorum ids short, the whole id in the title
    qid = json.loads(await in_browser(browser.evaluate, """JSON.stringify((() => {
        const q = document.querySelector('#quorum-id .qid'); return [q.textContent, q.title]; })())"""))
    assert qid[0] == "…" + qid[1][-5:] and len(qid[1]) == 13
    text = await in_browser(browser.evaluate, "document.body.innerText")
    assert qid[1] not in text  # no 13-digit id is spelled out anywhere on the page
    # no word said twice in a row in a line ("replica replica r1", "job job job COMPLETED")
    assert json.loads(await in_browser(browser.evaluate, DOUBLED)) == []
    ARTIFACTS.joinpath("ui").mkdir(parents=True, exist_ok=True)
    shot = await in_browser(browser.screenshot, ARTIFACTS / "ui" / "status-page-after-host-kill.png")
    width, height = png_size(shot.read_bytes())
    assert width >= 1000 and height >= 600



async def test_the_job_card_says_how_a_completed_job_ended(cluster, browser):
    """Three replicas finish (the job's id is "job": its COMPLETED event reads "job job
    COMPLETED: ..."): the card says COMPLETED and how, and counts finished replicas, not the
    healthy ones (none are healthy once every replica finished)."""
    c = cluster
    agents = [await c.start_agent(f"h{i}", replica=f"r{i}", command=trainer_command(c.ready_dir, "--join", "--finish-after", "4"))
              for i in range(3)]
    for agent in agents:
        assert await asyncio.wait_for(agent.proc.wait(), BOUND_S) == 0, agent.log()
    job = await c.get("/api/v1/job")
    assert job["job_state"] == "COMPLETED" and job["replicas_healthy"] == 0

    await in_browser(browser.open, f"{c.http}/ui")
    await in_browser(browser.wait_for, "document.getElementById('job-card')?.dataset.state === 'COMPLETED'", BOUND_S,
                     "the job card to say COMPLETED")
    card = json.loads(await in_browser(browser.evaluate, """JSON.stringify(['job-state', 'job-reason', 'healthy-label', 'healthy']
        .map(id => document.getElementById(id).textContent))"""))
    assert card[0] == "COMPLETED"
    if job.get("job_state_reason"):
        assert card[1] == job["job_state_reason"]
    else:  # how it ended, composed from the counts
        assert "3 of 3 replicas finished, 0 dead" in card[1], card
    assert card[2:] == ["finished replicas", "3 / 3"]
    events = await in_browser(browser.evaluate, """JSON.stringify([...document.querySelectorAll('#events tbody tr')]
        .filter(r => r.dataset.kind === 'job').map(r => [r.cells[2].textContent, r.cells[3].textContent]))""")
    (about, what), = json.loads(events)
    assert about == "job" and what.startswith("COMPLETED")
    assert json.loads(await in_browser(browser.evaluate, DOUBLED)) == []
