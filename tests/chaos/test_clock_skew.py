"""A host whose clock is skewed (tests/chaos/net_faults.py skewed_clock: libfaketime in the
agent's environment, so it and its trainers read the shifted time), each host on its own
network namespace: beyond the registration window (300 s, protos/credentials.py) the agent is
refused with a message naming the skew and exits 3; within it nothing changes: the agent
registers, gets its work and keeps its host ACTIVE past the heartbeat timeout."""

from __future__ import annotations

import sys
import time

import httpx

from controller.launch import launch
from fthsdp.demo import procs
from protos import job_secret
from protos.credentials import REGISTRATION_WINDOW_S
from tests.chaos.net_faults import skewed_clock
from tests.chaos.network import Network
from tests.waiting import wait_until

HEARTBEAT_TIMEOUT_S = 2.0
#: the "trainer": a process that waits for the agent's signal (the agent stops it at the end)
WAITER = [sys.executable, "-c", "import signal; signal.pause()"]
BEYOND_S = REGISTRATION_WINDOW_S + 100
WITHIN_S = REGISTRATION_WINDOW_S - 100


def test_a_skew_beyond_the_window_is_refused_by_name_and_one_within_changes_nothing(tmp_path):
    secret = job_secret.generate()
    with Network() as net:
        c, ahead, behind, within = net.add("c"), net.add("ahead"), net.add("behind"), net.add("within")
        with net.entered("c"), open(tmp_path / "controller.log", "w") as log:
            controller = launch("--job-id", "skew", "--replicas", "3", "--min-replicas", "1", "--host", c.address,
                                "--heartbeat-timeout-s", str(HEARTBEAT_TIMEOUT_S), stderr=log,
                                env=procs.environment(secret), insecure=False)
        agents = {}
        try:
            for node, skew, rid in ((ahead, BEYOND_S, "r0"), (behind, -BEYOND_S, "r1"), (within, WITHIN_S, "r2")):
                with net.entered(node.name):
                    agents[node.name] = procs.start_agent(
                        tmp_path / f"agent-{node.name}.log", controller=controller.grpc, host_id=node.name,
                        job_id="skew", command=WAITER, secret=secret, replica_id=rid, env=skewed_clock(skew),
                        extra=("--connect-timeout-s", "30"))
            for name in ("ahead", "behind"):
                assert agents[name].wait(60) == 3, (tmp_path / f"agent-{name}.log").read_text()
            ahead_log = (tmp_path / "agent-ahead.log").read_text()
            behind_log = (tmp_path / "agent-behind.log").read_text()
            assert f"{BEYOND_S:.0f}s ahead of this controller's clock" in ahead_log, ahead_log
            assert f"{BEYOND_S:.0f}s behind this controller's clock" in behind_log, behind_log

            registered = procs.read_json_line(agents["within"], 60.0, "the agent within the window")
            assert registered["event"] == "registered" and registered["assignment"]["replica_id"] == "r2"
            with net.observer(), httpx.Client(base_url=controller.http, timeout=5.0) as http:
                def hosts() -> dict:
                    return {h["host_id"]: h for h in http.get("/api/v1/hosts").json()}

                assert set(hosts()) == {"within"}  # the refused ones never became hosts
                # heartbeats keep it ACTIVE past twice the heartbeat timeout
                past = time.monotonic() + 2 * HEARTBEAT_TIMEOUT_S

                def heard_since() -> dict | None:
                    h = hosts()["within"]
                    assert h["state"] == "ACTIVE", h
                    return h if time.monotonic() > past and h["seconds_since_seen"] < HEARTBEAT_TIMEOUT_S else None

                wait_until(heard_since, 30.0, "the skewed host's heartbeats past twice the heartbeat timeout")
            assert agents["within"].poll() is None
        finally:
            for agent in agents.values():
                procs.stop(agent, 10.0)
            controller.stop()
