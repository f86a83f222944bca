"""The chaos invariants over synthetic recorded runs: a clean run passes, and each planted
violation is found and named (a checker that cannot fail would prove nothing)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from tests.chaos.executor import Injection, Recorded
from tests.chaos.invariants import check
from tests.chaos.schedule import ChaosSettings

S = ChaosSettings()
T0 = 1000.0
IDS = ("r0", "r1", "r2")


def trained_and_committed(rows: list, step: int, t: float, ledger: dict, included: tuple, before: str,
                          digest: str, quorum_id: int = 7) -> None:
    for rid in included:
        for rank in (0, 1):
            rows.append({"t": t, "replica": rid, "rank": rank, "pid": 1, "event": "trained", "step": step,
                         "quorum_id": quorum_id, "position": ledger.get(rid, 0)})
            rows.append({"t": t + 0.5, "replica": rid, "rank": rank, "pid": 1, "event": "commit", "step": step,
                         "quorum_id": quorum_id, "behind": False, "included": list(included),
                         "positions_before": dict(ledger), "position": ledger.get(rid, 0), "before": before,
                         "digest": digest})


def run_with_a_leader_kill(steps: int = 8) -> Recorded:
    """r1's leader is killed at step 2 (T0 + 2.2); r0 and r2 train on; r1 is HEALTHY again from step 4."""
    rows: list = []
    ledger = {rid: 0 for rid in IDS}
    before = ""
    for step in range(steps):
        included = IDS if step not in (2, 3) else ("r0", "r2")
        digest = f"s{step}"
        trained_and_committed(rows, step, T0 + step, ledger, included, before, digest)
        for rid in included:
            ledger[rid] += 1
        before = digest
    events = [
        {"at": T0 + 2.3, "kind": "death", "subject": "r1", "cause": "trainer_exit", "message": "r1 became DEAD"},
        {"at": T0 + 3.8, "kind": "replica", "subject": "r1", "cause": "", "message": "replica r1 became HEALTHY"},
    ]
    inj = Injection("kill_leader", "kill_leader:r1", T0 + 2.2, 2, ["r1"], [], ["SIGKILL r1 rank 0"],
                    done_at=T0 + 2.2, settled_at=T0 + 4.0)
    return Recorded(1, rows, events, [inj], [], True, T0, T0 + steps + 1)


def problems(rec: Recorded, settings: ChaosSettings = S) -> list[str]:
    return check(rec, settings).violations


def test_a_clean_run_passes_and_counts():
    verdict = check(run_with_a_leader_kill(), S)
    assert verdict.violations == []
    assert verdict.stats["steps"] == 8 and verdict.stats["faults"] == {"kill_leader": 1}
    assert verdict.stats["abandoned_branches"] == 0 and verdict.stats["detection_s_max"] == pytest.approx(0.1)


def test_different_states_after_one_commit_are_found():
    rec = run_with_a_leader_kill()
    next(r for r in rec.rows if r["event"] == "commit" and r["step"] == 5 and r["replica"] == "r2")["digest"] = "x"
    assert any("states differ after a commit: step 5 of quorum 7" in p for p in problems(rec))


@pytest.mark.parametrize("position, what", [(4, "again"), (6, "skipping one")])
def test_a_step_that_reads_a_batch_again_or_skips_one_breaks_the_history(position, what):
    rec = run_with_a_leader_kill()
    for r in rec.rows:  # step 5 reads r0's batch `position`: step 4 left r0 at 5
        if r["step"] == 5 and r["event"] == "commit":
            r["positions_before"]["r0"] = position
        if r["step"] == 5 and r["replica"] == "r0":
            r["position"] = position
    [found] = problems(rec)  # walked back from the end: step 6 finds no step 5 that left it r0 at 6
    assert found.startswith("exactly-once along the committed history: step 6 (ledger {'r0': 6") and \
        f"trained from a state no commit of step 5 produced (they left ledgers [{{'r0': {position + 1}" in found, what


def test_a_batch_a_step_included_but_its_replica_never_trained_is_found():
    rec = run_with_a_leader_kill()
    rec.rows = [r for r in rec.rows if not (r["replica"] == "r2" and r["step"] == 6 and r["event"] == "trained")]
    for r in rec.rows:
        if r["replica"] == "r2" and r["step"] == 6:
            r["position"] = 5  # ...it trained another one
    assert any("step 6 included batch 6 of replica r2, which trained [5] at that step" in p for p in problems(rec))


def abandon_a_branch(rec: Recorded) -> None:
    """r1 alone committed step 4 into another state from step 3's, a branch nobody continued."""
    trained_and_committed(rec.rows, 4, T0 + 4.1, {"r0": 4, "r1": 2, "r2": 4}, ("r1",), "s3", "lost4", quorum_id=8)
    rec.rows.sort(key=lambda r: r["t"])


def test_an_abandoned_branch_needs_a_rollback_event():
    rec = run_with_a_leader_kill()
    abandon_a_branch(rec)
    assert any("1 branch(es) of committed steps [4] were abandoned" in p and "silent change of history" in p
               for p in problems(rec))
    rec.events.append({"at": T0 + 4.5, "kind": "rollback", "subject": "9", "cause": "rollback", "message": "…"})
    verdict = check(rec, S)
    assert verdict.violations == [] and verdict.stats["abandoned_branches"] == 1 and verdict.stats["rollbacks"] == 1


def test_a_death_no_fault_explains_is_found():
    rec = run_with_a_leader_kill()
    rec.events.append({"at": T0 + 3.0, "kind": "death", "subject": "r2", "cause": "heartbeat", "message": "silent"})
    rec.events.append({"at": T0 + 7.5, "kind": "death", "subject": "r1", "cause": "heartbeat", "message": "silent"})
    rec.events.append({"at": T0 + 3.0, "kind": "host_death", "subject": "h0", "cause": "heartbeat", "message": "m"})
    found = problems(rec)
    assert any(p.startswith("replica r2 was declared dead at +3.0s (heartbeat: silent)") for p in found)
    assert any(p.startswith("replica r1 was declared dead at +7.5s") for p in found)  # after its fault's window
    assert any(p.startswith("host h0 was declared dead") for p in found)


def test_an_undetected_fault_and_a_replica_that_never_rejoined_are_found():
    rec = run_with_a_leader_kill()
    undetected = replace(rec, events=[e for e in rec.events if e["kind"] != "death"])
    assert any("r1 was hit, but the controller never declared it dead" in p for p in problems(undetected))
    gone = replace(rec, events=[e for e in rec.events if e["kind"] == "death"])
    assert any("r1 died at +2.3s and never became HEALTHY again" in p for p in problems(gone))
    unsettled = copy.deepcopy(rec)
    unsettled.injections[0].settled_at = None
    assert any("the job was not whole again" in p for p in problems(unsettled))


def test_a_killed_host_needs_a_host_death_and_a_killed_controller_a_new_leader():
    rec = run_with_a_leader_kill()
    rec.injections[0].hosts.append("h1")
    assert any("host h1 was killed, but no host death was recorded" in p for p in problems(rec))
    rec.events.append({"at": T0 + 2.4, "kind": "host_death", "subject": "h1", "cause": "heartbeat", "message": "m"})
    assert problems(rec) == []
    rec.injections.append(Injection("kill_controller", "kill_controller:controller", T0 + 6.0, 6, done_at=T0 + 6.5,
                                    settled_at=T0 + 7.0))
    assert any("no controller took over" in p for p in problems(rec))
    rec.events.append({"at": T0 + 6.6, "kind": "leader", "subject": "c2", "cause": "", "message": "took over"})
    assert problems(rec) == []


def test_a_stall_of_an_untouched_replica_past_the_bound_is_found():
    rec = run_with_a_leader_kill()
    tight = replace(S, allreduce_timeout_s=0.5, heartbeat_timeout_s=0.5, lease_ttl_s=0.5, join_timeout_s=0.5,
                    slack_s=1.0)
    assert tight.stall_bound_s == 2.0 and problems(rec, tight) == []  # r0 and r2 commit every second
    rec.rows = [r for r in rec.rows if not (r["replica"] == "r2" and r["event"] == "commit" and r["step"] in (2, 3))]
    stalls = [p for p in problems(rec, tight) if "went" in p]
    assert len(stalls) == 1 and "r2, which it did not touch, went 2.3s without a commit (bound 2s)" in stalls[0]


def test_a_broken_or_unfinished_run_is_a_violation():
    rec = replace(run_with_a_leader_kill(), error="RuntimeError: boom", finished=False)
    found = problems(rec)
    assert "the run broke: RuntimeError: boom" in found and "not every trainer of every replica finished" in found


def run_with_a_swap_then_a_controller_kill() -> Recorded:
    """kill_leader's run, read as swap_then_kill_controller: r1's host h1 killed at T0 + 2.2, r1
    HEALTHY on the spare at T0 + 3.8, the controller killed at T0 + 4.5, a new leader at T0 + 6."""
    rec = run_with_a_leader_kill()
    inj = rec.injections[0]
    inj.kind, inj.scheduled, inj.hosts = "swap_then_kill_controller", "swap_then_kill_controller:r1", ["h1"]
    inj.controller_killed_at = inj.quiet_after = T0 + 4.5
    inj.settled_at = T0 + 6.5
    rec.events += [{"at": T0 + 2.25, "kind": "host_death", "subject": "h1", "cause": "heartbeat", "message": "h1"},
                   {"at": T0 + 6.0, "kind": "leader", "subject": "controller", "cause": "", "message": "leads"}]
    return rec


def test_a_swap_then_a_controller_kill_passes_when_the_takeover_keeps_the_spare_s_work():
    assert problems(run_with_a_swap_then_a_controller_kill()) == []


def test_a_death_after_the_controller_kill_of_a_swap_is_a_violation():
    """Issue 28's chaos finding: the new leader refused the spare, then declared it dead."""
    rec = run_with_a_swap_then_a_controller_kill()
    rec.events.append({"at": T0 + 6.2, "kind": "death", "subject": "r1", "cause": "heartbeat",
                       "message": "r1 became DEAD: host spare0 died"})
    [found] = problems(rec)
    assert found.startswith("replica r1 was declared dead at +6.2s") and "a controller kill after a swap" in found


def test_a_composed_controller_kill_without_a_new_leader_is_found():
    rec = run_with_a_swap_then_a_controller_kill()
    rec.events = [e for e in rec.events if e["kind"] != "leader"]
    assert any("no controller took over after the active one was killed" in p for p in problems(rec))


def _skewed(skew_s: float, **observed) -> Recorded:
    rec = run_with_a_leader_kill()
    seen = {"skew_s": skew_s, "window_s": 300.0, "heartbeat_timeout_s": 3.0, "timed_out": False, **observed}
    rec.injections.append(Injection("skewed_host", f"skewed_host:a new host clock {skew_s:+.0f}s", T0 + 6.0, 6,
                                    observed=seen, done_at=T0 + 7.0, settled_at=T0 + 7.0))
    return rec


@pytest.mark.parametrize("skew_s, observed, found", [
    (412.0, {"exit_code": 3, "registered": False, "named": "412s ahead of this controller's clock"}, None),
    (-380.0, {"exit_code": 3, "registered": False, "named": "381s behind this controller's clock"}, None),
    (120.0, {"exit_code": None, "registered": True, "host_state": "SPARE", "heard_s_ago": 0.4}, None),
    # beyond the window, yet it became a host
    (412.0, {"exit_code": None, "registered": True, "host_state": "SPARE", "heard_s_ago": 0.4},
     "(beyond the 300s window) was not refused"),
    # refused, but the message names another skew (or the other side)
    (412.0, {"exit_code": 3, "registered": False, "named": "412s behind this controller's clock"},
     "refused without naming its skew (412s ahead of)"),
    (412.0, {"exit_code": 3, "registered": False}, "no skew in its log"),
    # within the window, refused
    (-120.0, {"exit_code": 3, "registered": False, "named": "120s behind this controller's clock"},
     "(within the 300s window) did not register and stay: exit 3"),
    # within, registered, then went silent
    (120.0, {"exit_code": None, "registered": True, "host_state": "SPARE", "heard_s_ago": 4.2},
     "last heard 4.2s ago"),
    (120.0, {"timed_out": True, "exit_code": None}, "neither exited nor registered"),
])
def test_a_skewed_host_is_refused_by_name_beyond_the_window_and_stays_within_it(skew_s, observed, found):
    verdict = check(_skewed(skew_s, **observed), S)
    if found is None:
        assert verdict.violations == []
        assert verdict.stats["skew_refused"] + verdict.stats["skew_within_stayed"] == 1
    else:
        assert len(verdict.violations) >= 1 and found in verdict.violations[0], verdict.violations


def test_a_spare_moved_off_with_no_fault_aimed_at_it_is_named_but_not_a_violation():
    rec = run_with_a_leader_kill()
    rec.injections.append(Injection("kill_host", "kill_host:r2", T0 + 5.0, 5, ["r2"], ["h2"], ["SIGKILL host h2"],
                                    done_at=T0 + 5.0, settled_at=T0 + 6.0))
    rec.events += [
        {"at": T0 + 5.4, "kind": "host_death", "subject": "h2", "cause": "heartbeat", "message": "host h2 died"},
        {"at": T0 + 5.4, "kind": "death", "subject": "r2", "cause": "host", "message": "r2 became DEAD"},
        {"at": T0 + 5.5, "kind": "cordon", "subject": "h2", "cause": "", "message": "host h2 cordoned: agent silent"},
        {"at": T0 + 5.9, "kind": "replica", "subject": "r2", "cause": "", "message": "replica r2 became HEALTHY"},
        {"at": T0 + 8.5, "kind": "cordon", "subject": "spare0", "cause": "",
         "message": "host spare0 cordoned: restart budget exhausted: 3 replica restart(s) in the last 300 s, budget 3"},
    ]
    rec.events.sort(key=lambda e: e["at"])
    verdict = check(rec, S)
    assert verdict.violations == []
    assert verdict.stats["unexplained_moves"] == [
        "+8.5s cordon of host spare0, which no fault was aimed at: host spare0 cordoned: restart budget exhausted: "
        "3 replica restart(s) in the last 300 s, budget 3"]
