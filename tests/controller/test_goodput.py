"""Live goodput through the controller's commands on a fake clock: covered time, effective training
ratio, step rate, time to detect and to recover, and what survives a failover."""

import random

import pytest

from controller.core.goodput import GoodputTracker
from controller.core.model import JoinRequest
from controller.settings import ControllerSettings
from tests.controller.drive import Driver

SETTINGS = ControllerSettings(replicas=2, min_replicas=1, join_timeout_s=1.0, heartbeat_timeout_s=10.0)


def form(state, steps, now):
    for rid, step in steps.items():
        state.join(JoinRequest(rid, step, 1), now)
    return state.close_round(now)


def trained_job():
    """r0 and r1 train steps 0 and 1; r1 dies at t=3.5 and is back, caught up, at t=6."""
    s = Driver(SETTINGS)
    form(s, {"r0": 0, "r1": 0}, 0.0)
    s.report("r0", 0, 1.0, quorum_id=s.view.replicas["r0"].given_quorum_id, step_time_s=0.8)
    s.report("r1", 0, 1.0, quorum_id=s.view.replicas["r1"].given_quorum_id, step_time_s=0.9)
    form(s, {"r0": 1, "r1": 1}, 1.0)
    s.report("r0", 1, 2.0, quorum_id=s.view.replicas["r0"].given_quorum_id, step_time_s=50.0)  # a leader that over-reports: clipped to 1 s
    s.report("r1", 1, 2.0, quorum_id=s.view.replicas["r1"].given_quorum_id)  # no step time reported: the interval since its last commit
    s.beat_replicas(["r1"], 3.0)
    s.report_dead("r1", "GPU fell off the bus", 3.5)
    form(s, {"r0": 2}, 4.0)
    s.report("r0", 2, 5.0, quorum_id=s.view.replicas["r0"].given_quorum_id, step_time_s=0.5)
    form(s, {"r0": 3, "r1": 1}, 5.0)  # r1 rejoins behind
    s.report("r1", 3, 6.0, quorum_id=s.view.replicas["r1"].given_quorum_id, step_time_s=0.7)  # its catch-up step (max step 3): trains nothing
    s.report("r0", 3, 6.0, quorum_id=s.view.replicas["r0"].given_quorum_id, step_time_s=0.6)
    return s


def test_covered_time_ratio_and_failures():
    s = trained_job()
    v = s.view.goodput.view(6.0)
    assert v.started_at == 0.0 and v.wall_s == 6.0 and v.committed_step == 3
    assert v.replicas["r0"]["covered_s"] == pytest.approx(0.8 + 1.0 + 0.5 + 0.6)
    assert v.replicas["r1"]["covered_s"] == pytest.approx(0.9 + 1.0)
    assert v.effective_training_ratio == pytest.approx((2.9 + 1.9) / (2 * 6.0), abs=1e-4)
    assert v.replicas["r1"]["commits"] == 3 and v.replicas["r1"]["failures"] == 1
    assert v.healthy == 2
    (failure,) = v.recent_failures
    assert failure["cause"] == "reported" and failure["detect_s"] == pytest.approx(0.5)  # last heartbeat at 3.0
    assert failure["recover_s"] == pytest.approx(2.5)  # DEAD at 3.5, HEALTHY after catching up at 6.0
    assert v.committed_steps_per_s == pytest.approx(4 / 6.0, abs=1e-3)  # 4 advances, all inside the window
    observed = [(o.what, round(o.seconds, 3)) for o in s.take_observations()]
    assert ("detect", 0.5) in observed and ("recover", 2.5) in observed
    assert sorted(sec for what, sec in observed if what == "step") == [0.5, 0.6, 0.8, 0.9, 1.0, 1.0]
    assert s.take_observations() == []


def test_step_rate_window_and_history():
    g = GoodputTracker(1, window_s=10.0)
    g.on_join("r0", 0.0)
    g.on_quorum(["r0"], 0.0)
    g.on_state("r0", True, False, "", 0.0, 0.0)
    for step in range(30):
        g.on_commit("r0", step, 0.5, True, 1.0 + step)
    v = g.view(30.0)
    assert v.committed_steps_per_s == pytest.approx(1.0)  # steps at t=21..30 are inside (20, 30]
    assert g.view(100.0).committed_steps_per_s == 0.0
    assert v.effective_training_ratio == pytest.approx(15 / 30)
    assert g.history[0] == (0.0, -1, 1) and g.history[-1] == (30.0, 29, 1)
    assert all(b[0] - a[0] >= 1.0 for a, b in zip(g.history, list(g.history)[1:]))


def test_goodput_survives_a_failover_and_open_intervals_restart():
    s = trained_job()
    before = s.view.goodput.view(6.0)
    new = Driver.restored(SETTINGS, s.view.snapshot_replicas(), [], 60.0, None, s.view.snapshot_journal())
    after = new.view.goodput.view(60.0)
    assert after.started_at == 0.0 and after.committed_step == 3 and after.healthy == 2
    assert after.replicas["r0"]["covered_s"] == before.replicas["r0"]["covered_s"]
    assert after.recent_failures == before.recent_failures
    assert list(new.view.goodput.history) == list(s.view.goodput.history)
    # the 54 s of the failover are not covered: the first commit after it covers nothing
    form(new, {"r0": 4, "r1": 4}, 61.0)
    new.report("r0", 4, 61.0, quorum_id=new.view.replicas["r0"].given_quorum_id, step_time_s=0.5)
    assert new.view.goodput.view(61.0).replicas["r0"]["covered_s"] == before.replicas["r0"]["covered_s"]


def test_telemetry_off_tracks_nothing():
    s = Driver(ControllerSettings(**{**SETTINGS.__dict__, "telemetry": False}))
    form(s, {"r0": 0, "r1": 0}, 0.0)
    s.report("r0", 0, 1.0, quorum_id=s.view.replicas["r0"].given_quorum_id, step_time_s=0.8)
    v = s.view.goodput.view(1.0)
    assert v.started_at is None and v.replicas == {} and s.take_observations() == []
    assert s.view.max_committed_step == 0  # the controller itself is unchanged


def test_random_reports_never_cover_more_than_wall_time():
    """Against a naive reference: covered = sum of min(reported, time since the later of the
    last commit and the quorum), and never more than the wall time."""
    rng = random.Random(7)
    for _ in range(50):
        g = GoodputTracker(3)
        now, naive, since = 0.0, {}, {}
        for rid in ("r0", "r1", "r2"):
            g.on_join(rid, now)
        g.on_quorum(["r0", "r1", "r2"], now)
        since = {rid: 0.0 for rid in ("r0", "r1", "r2")}
        for step in range(40):
            now += rng.uniform(0, 3)
            rid = rng.choice(("r0", "r1", "r2"))
            reported = rng.choice((None, 0.0, rng.uniform(0, 10), 1e9))
            g.on_commit(rid, step, reported, True, now)
            interval = now - since[rid]
            naive[rid] = naive.get(rid, 0.0) + (min(reported, interval) if reported else interval)
            since[rid] = now
        v = g.view(now)
        for rid, covered in naive.items():
            assert v.replicas[rid]["covered_s"] == pytest.approx(covered, abs=2e-3)
            assert v.replicas[rid]["covered_s"] <= v.wall_s + 1e-6
        assert 0.0 <= v.effective_training_ratio <= 1.0


def test_a_rollback_and_a_roll_forward_take_back_the_time_of_the_steps_they_abandon():
    """Three replicas train steps 0..3 at one second a step. r2 is lost, and r0 and r1 come
    back as new processes holding step 0's state: the rollback abandons steps 1..3, whose
    covered time goes. r0 and r1 train steps 1 and 2 again; then r2 comes back with step 3
    and rolls the history forward: the retrained steps 1..2 go too."""
    s = Driver(ControllerSettings(replicas=3, min_replicas=1, join_timeout_s=1.0,
                                           heartbeat_timeout_s=100.0, rollback_wait_s=0.0))

    def rnd(steps, now, incarnation="a"):
        for rid, step in steps.items():
            s.join(JoinRequest(rid, step, 1, incarnation=f"{rid}-{incarnation}"), now)
        return s.close_round(now)

    def commit(rids, now):
        for rid in rids:
            s.report(rid, s.view.replicas[rid].given_step, now, quorum_id=s.view.replicas[rid].given_quorum_id,
                          step_time_s=1.0)

    for step in range(4):
        rnd({"r0": step, "r1": step, "r2": step}, float(step))
        commit(("r0", "r1", "r2"), step + 1.0)
    assert s.view.goodput.view(4.0).replicas["r0"]["covered_s"] == pytest.approx(4.0)
    s.report_dead("r2", "silent", 4.0)
    q = rnd({"r0": 1, "r1": 1}, 4.0, incarnation="b")
    assert "ROLLBACK" in q.reason and s.view.steps_lost == {"rollback": 3}
    v = s.view.goodput.view(4.0)
    for rid in ("r0", "r1", "r2"):
        assert v.replicas[rid]["covered_s"] == pytest.approx(1.0) and v.replicas[rid]["abandoned_s"] == pytest.approx(3.0)
    commit(("r0", "r1"), 5.0)
    rnd({"r0": 2, "r1": 2}, 5.0, incarnation="b")
    commit(("r0", "r1"), 6.0)
    assert s.view.goodput.view(6.0).replicas["r0"]["covered_s"] == pytest.approx(3.0)
    q = rnd({"r0": 3, "r1": 3, "r2": 4}, 6.0, incarnation="c")  # r2 is back with step 3: roll forward
    assert q.max_step == 4 and s.view.steps_lost["abandoned"] == 2
    v = s.view.goodput.view(6.0)
    assert v.replicas["r0"]["covered_s"] == pytest.approx(1.0) and v.replicas["r0"]["abandoned_s"] == pytest.approx(5.0)
    # r2's steps 1..3 are the history again, but what the rollback took back is not given back
    assert v.replicas["r2"]["covered_s"] == pytest.approx(1.0)
    assert v.effective_training_ratio == pytest.approx(3.0 / (3 * 6.0), abs=1e-4)
    restored = GoodputTracker(3)
    restored.restore(s.view.goodput.snapshot(), None, 6.0)
    assert restored.view(6.0).replicas["r0"]["abandoned_s"] == pytest.approx(5.0)
