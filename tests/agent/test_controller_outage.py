"""An agent that lost its controller after its trainers had trained keeps them alive while it
retries (issue 41), with real processes: a controller, an agent and its trainer. The controller
is killed; past the agent's reconnect timeout (a short setting) the trainer still runs, and a
controller that comes back on the same address finds the agent and the same trainer. The
decision on a fake clock is in tests/agent/test_policy.py."""

from __future__ import annotations

import pytest

from tests.agent.cluster import CLI, Cluster
from tests.agent.helpers import alive, trainer_command, wait_for
from tests.ports import free_port
from tests.waiting import wait_for_async

pytestmark = pytest.mark.slow
BOUND_S = 60


async def test_an_agent_keeps_its_trainers_past_the_reconnect_timeout_and_a_returning_controller_finds_them(tmp_path):
    c = Cluster(tmp_path)
    port = free_port()
    try:
        first = await c.start_controller(1, 0, "--grpc-port", str(port))
        agent = await c.start_agent("h0", replica="r0", command=trainer_command(c.ready_dir),
                                    extra=("--reconnect-timeout-s", "15"))  # kept until 30 s
        [trainer] = await wait_for(lambda: c.trainers("r0"), BOUND_S, "the trainer ready")
        first.proc.kill()
        await first.proc.wait()
        await wait_for(lambda: "still run and hold their replica's state: kept" in agent.log(), BOUND_S,
                       "the agent to keep its trainer past its reconnect timeout")
        assert alive(trainer["pid"]) and agent.proc.returncode is None

        again = await c._spawn("controller-again", *CLI, "controller", "--grpc-port", str(port), "--http-port", "0",
                               "--replicas", "1", "--min-replicas", "1", "--heartbeat-timeout-s", "3",
                               "--admin-token-file", str(c.token_file))
        line = await wait_for(again.first_line, 30, "the controller back on the same address")
        c.http = line["http"]

        async def registered() -> bool:
            hosts = {h["host_id"]: h for h in await c.get("/api/v1/hosts")}
            return "h0" in hosts and (hosts["h0"]["assignment"] or {}).get("replica_id") == "r0"
        await wait_for_async(registered, BOUND_S, "h0 registered with the returning controller, running r0")
        assert alive(trainer["pid"]) and [t["pid"] for t in c.trainers("r0")] == [trainer["pid"]]  # never restarted
    finally:
        await c.close()
