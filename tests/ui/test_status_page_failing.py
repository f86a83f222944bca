"""The status page of a job that can make no progress, before it FAILS (issue 39, finding 3), in
a real headless Chromium against a live controller process: the card says FAILING in amber with
the countdown, the replicas table shows every configured replica (none ever joined) as DEAD,
the cordoned host is never shown as SPARE, and ids are shown one way everywhere."""

from __future__ import annotations

import json

import grpc
import pytest

from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from tests.ui.test_status_page import browser, in_browser  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow
BOUND_S = 30


def crash_loop_of_two_causes(grpc_address: str) -> None:
    """h0 runs r0, h1 runs r1, s0 is a spare; every trainer dies before its first join and each
    host's budget (0) is spent at once: s0 takes r0 from h0 and dies too. Two causes: the job
    waits fail_after_s (one cause would FAIL it at once)."""
    with grpc.insecure_channel(grpc_address) as channel:
        stub = pbg.ControllerStub(channel)
        secrets = {}
        for host, replica in (("h0", "r0"), ("h1", "r1"), ("s0", "")):
            assignment = pb.Assignment(replica_id=replica, ranks=[0], world_size=1) if replica else None
            secrets[host] = stub.RegisterAgent(pb.RegisterAgentRequest(
                host_id=host, incarnation=f"{host}-1", spare=not replica, assignment=assignment), timeout=10).agent_secret
        for host, replica, tail in (("h0", "r0", "RuntimeError: CUDA error"), ("s0", "r0", "RuntimeError: CUDA error"),
                                    ("h1", "r1", "OSError: disk full")):
            stub.ReportTrainerExit(pb.TrainerExitRequest(host_id=host, replica_id=replica, rank=0, exit_code=1,
                                                         stderr_tail=tail, agent_secret=secrets[host]), timeout=10)


async def test_a_failing_job_shows_failing_every_replica_and_no_cordoned_spare(controller_process, browser):  # noqa: F811
    ctl = controller_process("--job-id", "job", "--replicas", "2", "--min-replicas", "1", "--restart-budget", "0",
                             "--fail-after-s", "300", "--heartbeat-timeout-s", "120", "--event-log", "off")
    crash_loop_of_two_causes(ctl.grpc)
    await in_browser(browser.open, f"{ctl.http}/ui")
    await in_browser(browser.wait_for, "document.getElementById('job-card')?.dataset.state === 'FAILING'", BOUND_S,
                     "the job card to say FAILING")
    card = json.loads(await in_browser(browser.evaluate, """JSON.stringify((() => {
        const card = document.getElementById('job-card'), badge = document.getElementById('job-state');
        return [badge.textContent, getComputedStyle(badge).backgroundColor, getComputedStyle(card).borderLeftColor,
                document.getElementById('job-reason').textContent, Number(card.dataset.failsIn),
                document.getElementById('job-countdown').textContent]; })())"""))
    amber = "rgb(178, 106, 0)"  # --warn
    assert card[:3] == ["FAILING", amber, amber]
    assert card[3].startswith("no replica can make progress: all 2 are DEAD") and "the job FAILS in " in card[3]
    assert 0 < card[4] <= 300 and card[5].startswith("FAILED in ") and card[5].endswith(" s")
    assert abs(int(card[5].split()[2]) - card[4]) <= 0.5  # the countdown to fail_after_s, in whole seconds
    replicas = json.loads(await in_browser(browser.evaluate, """JSON.stringify([...document.querySelectorAll(
        '#replicas tbody tr')].map(r => [r.dataset.replica, r.dataset.state, r.cells[3].textContent]))"""))
    assert replicas == [["r0", "DEAD", "none yet"], ["r1", "DEAD", "none yet"]]
    hosts = json.loads(await in_browser(browser.evaluate, """JSON.stringify(Object.fromEntries([...document.querySelectorAll(
        '#hosts tbody tr')].map(r => [r.dataset.host, [r.dataset.state, r.cells[2].textContent]])))"""))
    assert hosts["h0"] == ["CORDONED", "cordoned: out of the spare pool"]
    assert hosts["h1"] == ["CORDONED", "waits for a spare to take its work"]
    assert "SPARE" not in {state for state, _ in hosts.values()}
    # ids one way everywhere: order ids in the events table are shown as quorum ids are
    orders = json.loads(await in_browser(browser.evaluate, """JSON.stringify([...document.querySelectorAll(
        '#events tbody tr')].filter(r => r.dataset.kind === 'order').flatMap(r => [...r.querySelectorAll('.qid')])
        .map(q => [q.textContent, q.title, getComputedStyle(q).whiteSpace]))"""))
    assert orders, "order events with their ids"
    for shown, whole, wrap in orders:
        assert whole.startswith("o") and len(whole) == 14 and shown == "o…" + whole[-5:] and wrap == "nowrap"
    same = json.loads(await in_browser(browser.evaluate, """JSON.stringify(withShortIds(
        'orders o1796621964577..o1796621964579 after quorum 1796621964580').filter(n => n.className === 'qid')
        .map(n => n.textContent))"""))
    assert same == ["o…64577", "o…64579", "…64580"]
    text = await in_browser(browser.evaluate, "document.body.innerText")
    assert 'job "job"' not in text and "job job" not in text
