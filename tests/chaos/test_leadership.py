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
