"""The structured event log: one JSON line per decision, with a level; events persist in the
store and survive a real failover (two controller processes on a real etcd)."""

import asyncio
import json
import logging
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest

from controller.core.events import KINDS, LEVELS
from controller.service.event_log import LOGGER
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from tests.ha.cluster import JOB, ControllerProcess, LeaderLog, train
from tests.waiting import wait_for_blocking

from .conftest import quorum_request

ADMIN = {"Authorization": "Bearer s3cret"}
EVENTS_JOB = f"{JOB}-events"  # its own key prefix in the session's shared etcd


def lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) | {"logging_level": r.levelname} for r in caplog.records if r.name == LOGGER]


async def test_every_decision_is_one_json_line_with_a_level(server, stub, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    pairs = (("h0", "r0"), ("h1", "r1"), ("h2", "r2"))
    for host, replica in pairs:
        await stub.RegisterAgent(pb.RegisterAgentRequest(host_id=host, incarnation="1", labels={"zone": "z"},
                                                         assignment=pb.Assignment(replica_id=replica, ranks=[0],
                                                                                  world_size=1)))
    await stub.RegisterAgent(pb.RegisterAgentRequest(host_id="s0", incarnation="1", spare=True))
    answers = await asyncio.gather(*(stub.Quorum(quorum_request(r, 0, world=1, host_id=h), timeout=10)
                                     for h, r in pairs))
    await stub.ReportFailure(pb.ReportFailureRequest(job_id="t", replica_id="r1", kind=pb.ReportFailureRequest.COMMIT_FAILED,
                                                     reason="allreduce timed out", host_id="h1",
                                                     quorum_id=answers[1].quorum_id, step=answers[1].max_step))
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        assert (await http.post("/api/v1/hosts/h0/drain", headers=ADMIN)).status_code == 200
        events = (await http.get("/api/v1/events")).json()
    got = lines(caplog)
    assert [e["seq"] for e in got] == sorted(e["seq"] for e in got) and len({e["seq"] for e in got}) == len(got)
    assert events[0]["kind"] == "leader" and "of a new job" in events[0]["message"]  # logged before caplog
    assert [(e["seq"], e["kind"], e["message"], e["level"]) for e in events[1:]] == \
        [(e["seq"], e["kind"], e["message"], e["level"]) for e in got]  # the log and the API agree
    by_kind = {}
    for e in got:
        by_kind.setdefault(e["kind"], []).append(e)
        assert e["job_id"] == "t" and e["ts"].endswith("Z")
        assert e["logging_level"] == e["level"].upper()
    assert {"host", "replica", "quorum", "commit_failed", "cordon", "death", "swap", "order"} <= set(by_kind)
    assert by_kind["death"][0]["level"] == "warning" and by_kind["death"][0]["cause"] == "host"
    assert "allreduce timed out" in by_kind["commit_failed"][0]["message"]
    (orders,) = by_kind["order"]
    assert "ASSIGN to host s0 (replica r0 ranks 0)" in orders["message"] and "STOP to host h0" in orders["message"]


def test_a_bad_event_log_path_is_refused_by_name(tmp_path):
    bad = tmp_path / "missing" / "events.log"
    proc = subprocess.run([sys.executable, "-m", "controller.main", "--grpc-port", "0", "--http-port", "0",
                           "--event-log", str(bad)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and f"cannot open --event-log {bad}" in proc.stderr


@pytest.mark.etcd
@pytest.mark.slow
async def test_events_survive_a_real_failover(etcd, tmp_path):
    controllers = []
    for name in ("a", "b"):
        c = ControllerProcess(etcd.endpoint, replicas=2, name=name)
        c.flags += ["--job-id", EVENTS_JOB, "--event-log", str(tmp_path / f"{name}.jsonl")]  # later flags win
        controllers.append(c.start())
    try:
        await wait_for_blocking(lambda: any(c.leads() for c in controllers), 20, "a leader")
        leader, standby = controllers if controllers[0].leads() else controllers[::-1]
        logs = {r: LeaderLog(r) for r in ("r0", "r1")}
        stop = asyncio.Event()
        task = asyncio.ensure_future(asyncio.gather(
            *(train([leader.grpc], rid, logs[rid], stop, job_id=EVENTS_JOB) for rid in logs)))
        await wait_for_blocking(lambda: all(len(log.acked_steps) >= 3 for log in logs.values()), 30, "3 steps each")
        async with grpc.aio.insecure_channel(leader.grpc) as channel:
            await pbg.ControllerStub(channel).ReportFailure(pb.ReportFailureRequest(
                job_id=EVENTS_JOB, replica_id="r1", kind=pb.ReportFailureRequest.REPLICA_DEAD, reason="ECC error"))
        # a warning is durable before the report is answered: the standby reads it from etcd now
        seen = httpx.get(f"{standby.http}/api/v1/events", params={"limit": 1000}, timeout=5).json()
        death = next(e for e in seen if e["kind"] == "death" and "ECC error" in e["message"])
        leader.signal(signal.SIGKILL)
        await wait_for_blocking(standby.leads, 30, "the standby to take over")
        stop.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        after = httpx.get(f"{standby.http}/api/v1/events", params={"limit": 1000}, timeout=5).json()
        assert death in after  # same seq, time, message: kept across the failover
        seqs = [e["seq"] for e in after]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        takeover = after[-1] if after[-1]["kind"] == "leader" else next(e for e in after if e["seq"] > death["seq"]
                                                                       and e["kind"] == "leader")
        assert takeover["level"] == "warning" and "taking over" in takeover["message"]
        assert takeover["seq"] > death["seq"]
        written = [json.loads(line) for line in (tmp_path / f"{'a' if leader is controllers[0] else 'b'}.jsonl")
                   .read_text().splitlines()]
        assert any(e["seq"] == death["seq"] and e["message"] == death["message"] for e in written)
        new_log = (tmp_path / f"{'b' if leader is controllers[0] else 'a'}.jsonl").read_text().splitlines()
        assert any(json.loads(line)["seq"] == takeover["seq"] for line in new_log)
    finally:
        for c in controllers:
            c.stop()


def test_every_event_kind_the_core_records_has_a_level_and_a_meaning():
    core = Path(__file__).resolve().parents[2] / "controller" / "core"
    called = r'(?:_event|_announce)\(\s*now,\s*"([a-z_]+)"'  # the state's _event, a component's _announce
    kinds = {k for f in core.glob("*.py") for k in re.findall(called, f.read_text())}
    assert len(kinds) >= 15 and kinds <= set(KINDS), sorted(kinds - set(KINDS))
    assert all(level in LEVELS and meaning for level, meaning in KINDS.values())
    documented = (core.parents[1] / "docs" / "operations.md").read_text()
    assert all(f"| `{k}` | {level} |" in documented for k, (level, _) in KINDS.items())
