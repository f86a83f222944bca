"""Who led when (tests/chaos/leadership.py): spans from each controller's own events, and the
overlap that means fencing did not hold."""

from __future__ import annotations

from tests.chaos.leadership import leader_spans, leadership_lines, overlaps


def _e(at: float, what: str) -> dict:
    return {"at": at, "message": f"controller x {what}"}


def test_a_step_down_before_the_next_election_is_no_overlap():
    spans = leader_spans({"a": [_e(1, "became the leader"), _e(5, "stepped down: leadership lost")],
                          "b": [_e(5.2, "became the leader of a new job")]}, {}, end=9)
    assert spans == [("a", 1, 5), ("b", 5.2, 9)]
    assert overlaps(spans) == []


def test_a_leader_that_steps_down_after_the_next_one_was_elected_overlaps():
    spans = leader_spans({"a": [_e(1, "became the leader"), _e(5.2, "stepped down: leadership lost")],
                          "b": [_e(5.0, "became the leader")]}, {}, end=9)
    (found,) = overlaps(spans)
    assert "controllers a and b both acted as leader from 5.000 to 5.200" in found


def test_a_killed_leader_leads_until_its_kill_and_again_after_its_restart():
    lines = {"a": [_e(1, "became the leader"), _e(8, "became the leader")],
             "b": [_e(4, "became the leader"), _e(7, "stepped down: leadership lost")]}
    spans = leader_spans(lines, {"a": [3.0]}, end=10)
    assert spans == [("a", 1, 3.0), ("b", 4, 7), ("a", 8, 10)]
    assert overlaps(spans) == []
    assert overlaps(leader_spans(lines, {}, end=10))  # without the kill, a would still lead at 4


def test_the_log_lines_are_read_from_a_controller_log(tmp_path):
    log = tmp_path / "controller-a.log"
    log.write_text('2026-12-07 05:42:11,566 INFO fthsdp.controller: controller a became leader\n'
                   '{"ts": "2026-12-07T05:42:11.566Z", "kind": "leader", "message": "controller a became the leader"}\n'
                   '{"ts": "2026-12-07T05:42:12.000Z", "kind": "replica", "message": "r0 became HEALTHY"}\n'
                   '{"ts": "not a time", "kind": "leader", "message": "garbled"}\n')
    (line,) = leadership_lines(log)
    assert line["message"] == "controller a became the leader"
    assert abs(line["at"] - 1796622131.566) < 1e-3
    assert leadership_lines(tmp_path / "missing.log") == []


# -- the invariants over a whole recorded run (tests/chaos/invariants.py) -----------------------

def _problems(**changes) -> list[str]:
    from dataclasses import replace

    from tests.chaos.invariants import check
    from tests.chaos.test_invariants import S, run_with_a_leader_kill
    return check(replace(run_with_a_leader_kill(), **changes), S).violations


def test_a_run_where_two_controllers_led_at_once_is_a_violation_and_one_after_the_other_is_not():
    from tests.chaos.test_invariants import T0
    one_after = {"a": [_e(T0, "became the leader"), _e(T0 + 3, "stepped down: leadership lost")],
                 "b": [_e(T0 + 3.1, "became the leader")]}
    assert _problems(leadership=one_after) == []
    both = {"a": [_e(T0, "became the leader"), _e(T0 + 3.2, "stepped down: leadership lost")],
            "b": [_e(T0 + 3.1, "became the leader")]}
    (found,) = _problems(leadership=both)
    assert "controllers a and b both acted as leader" in found


def test_a_commit_while_cut_off_and_a_process_left_running_are_violations():
    from tests.chaos.executor import Injection
    from tests.chaos.test_invariants import T0, run_with_a_leader_kill
    rec = run_with_a_leader_kill()
    # r1 is partitioned at T0 + 2.2 until T0 + 9.5: its commit at step 7 (T0 + 7.5) came from a replica cut off
    inj = Injection("partition_host", "partition_host:r1 for 7.3s", T0 + 2.2, 2, ["r1"], ["h1"],
                    done_at=T0 + 9.5, settled_at=T0 + 9.6)
    found = _problems(injections=[inj])
    assert any("r1 committed step" in p and "while cut off from its quorum" in p for p in found), found
    (left,) = _problems(leftover=["pid 42 on h1"])
    assert "processes still running after the run stopped everything: pid 42 on h1" in left
    assert rec.leftover == []
