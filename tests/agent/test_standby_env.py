"""A standby trainer knows its device slot: LOCAL_RANK is its slot on the host (so eight standbys
on one host build on eight GPUs), and the placement later handed to that slot has that local rank."""

from __future__ import annotations

from agent import env
from agent.orders import Assignment, placements


def test_a_standby_gets_its_slot_as_local_rank_and_nothing_else_of_an_assignment():
    base = {"LOCAL_RANK": "7", "RANK": "3", "PATH": "/bin"}
    got = env.trainer_environment(base, None, host_id="h1", job_id="j", controller="c:1", slot=5)
    assert got["FTHSDP_STANDBY"] == "1" and got["LOCAL_RANK"] == "5"
    assert "RANK" not in got and "FTHSDP_REPLICA_ID" not in got and got["PATH"] == "/bin"


def test_the_placement_of_a_slot_has_the_slots_local_rank():
    a = Assignment("r0", (8, 9, 10), 16)
    assert [p.local_rank for p in placements(a)] == [0, 1, 2]
    got = env.trainer_environment({}, placements(a)[2], host_id="h1", job_id="j", controller="c:1", slot=2)
    assert got["LOCAL_RANK"] == "2" and got["RANK"] == "10" and "FTHSDP_STANDBY" not in got
