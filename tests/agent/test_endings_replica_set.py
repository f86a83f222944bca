"""Issue 26, scenario 2 with another rank count: a real controller and real agents (scripted
leaders, tests/agent/fake_trainer.py). Host h1 holds rank 0 of replica r1 configured with 2
ranks, but its trainer joins saying 1 (a script started with the wrong world size): every join
is refused naming the configured size, r1 never registers, and r0 trains on unaffected.
(A replica id outside the configured set: tests/runtime/test_endings_cluster.py.)"""

from __future__ import annotations

import pytest

from tests.agent.cluster import Cluster
from tests.agent.helpers import trainer_command, wait_for, wait_for_async

pytestmark = pytest.mark.slow
BOUND_S = 60


async def test_a_replica_joining_with_another_rank_count_is_refused_and_the_others_train_on(tmp_path):
    c = Cluster(tmp_path)
    try:
        await c.start_controller(2, 0)
        await c.start_agent("h0", replica="r0")
        wrong = await c.start_agent("h1", replica="r1", world_size=2,
                                    command=("env", "FTHSDP_WORLD_SIZE=1", *trainer_command(c.ready_dir, "--join")))
        refusal = ("controller: FAILED_PRECONDITION: replica r1 joined with 1 rank(s), but it is configured with 2 "
                   "(its hosts' assignment)")
        await wait_for(lambda: wrong.log().count(refusal) >= 2, BOUND_S, "r1's joins refused, again and again")

        async def r0_trains_alone():
            r0 = await c.replica("r0")
            return r0 is not None and r0["state"] == "HEALTHY" and r0["committed_step"] >= 5
        await wait_for_async(r0_trains_alone, BOUND_S, "r0 committing")
        r1 = await c.replica("r1")  # refused before anything changed: listed only as its host runs it
        assert (r1["state"], r1["incarnation"], r1["world_size"]) == ("JOINING", "", 2), r1
        assert r1["reason"].startswith("not joined yet"), r1
        quorums = [e["message"] for e in await c.events("quorum")]
        assert quorums and all(" r0 at step " in q for q in quorums), quorums
    finally:
        await c.close()
