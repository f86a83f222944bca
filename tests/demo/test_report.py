"""Report computations over synthetic trainer records and controller events (pure)."""

from __future__ import annotations

import pytest

from fthsdp.demo import report

R = ["r0", "r1"]


def step(replica, n, included, positions, t, began, behind=False, loss=1.0, rank=0, event="commit", digest=None,
         before=""):
    return {"event": event, "replica": replica, "rank": rank, "step": n, "included": included,
            "positions_before": positions, "t": t, "began": began, "behind": behind, "loss": loss,
            "position": positions.get(replica, 0), "before": before, "digest": digest or f"d{n}"}


def trained(replica, n, position, rank=0):
    return {"event": "trained", "replica": replica, "rank": rank, "step": n, "position": position, "t": 0.0}


def healthy_history():
    """Two replicas, three steps; r1 fails step 1, catches up at step 2 from r0's ledger."""
    return [
        trained("r0", 0, 0), trained("r1", 0, 0),
        step("r0", 0, ["r0", "r1"], {}, 1.0, 0.0, loss=2.0), step("r1", 0, ["r0", "r1"], {}, 1.0, 0.0, loss=4.0),
        trained("r0", 1, 1),
        step("r0", 1, ["r0"], {"r0": 1, "r1": 1}, 2.0, 1.0, loss=1.0, before="d0"),
        step("r1", 1, ["r0"], {"r0": 1, "r1": 1}, 2.0, 1.5, event="retry"),
        trained("r0", 2, 2), trained("r1", 2, 1),
        step("r0", 2, ["r0", "r1"], {"r0": 2, "r1": 1}, 3.0, 2.0, loss=0.5, before="d1"),
        step("r1", 2, ["r0", "r1"], {"r0": 2, "r1": 1}, 3.0, 2.0, loss=0.7),
    ]


def both(n, digest, before, t, included=("r0", "r1")):
    """Step n of `healthy_history`'s sequel: it reads r0 at n, r1 at n - 1 (or 2, when r1 is left out)."""
    ledger = {"r0": n, "r1": n - 1 if len(included) == 2 else 2}
    return [trained(r, n, ledger[r]) for r in included] + [
        step(r, n, list(included), ledger, t, t - 1.0, digest=digest, before=before, loss=t / 10) for r in R]


def rolled_back_history():
    """`healthy_history`, then steps 3 and 4 that included r0 only; the job resumes from step 2's
    checkpoint and trains steps 3 and 4 again (with both replicas, into other states), then step 5."""
    return healthy_history() + both(3, "d3", "d2", 4.0, ("r0",)) + both(4, "d4", "d3", 5.0, ("r0",)) + \
        both(3, "e3", "d2", 7.0) + both(4, "e4", "e3", 8.0) + both(5, "e5", "e4", 9.0)


def test_exactly_once_holds_for_a_consistent_history():
    assert report.exactly_once(healthy_history(), R) == []
    assert report.history_of(healthy_history(), R)[0] == {"steps": 3, "abandoned_commits": 0,
                                                           "abandoned_branches": 0, "abandoned_steps": []}


def test_a_rollback_that_trains_steps_again_is_counted_not_a_problem():
    view, problems = report.history_of(rolled_back_history(), R)
    assert problems == []
    assert view == {"steps": 6, "abandoned_commits": 2, "abandoned_branches": 1, "abandoned_steps": [3, 4]}
    main = report.summary(rolled_back_history() + [
        {"event": "done", "replica": r, "rank": 0, "digest": "e5", "step": 6, "test_loss": 0.2, "test_acc": 0.9}
        for r in R], R, 1, batch_rows=32)
    assert main["exactly_once"] and main["problems"] == [] and main["history"] == view
    # what the rolled-back steps trained is not in the loss curve or the samples seen
    assert report.loss_by_step(rolled_back_history())[3] == pytest.approx(0.7)
    assert main["samples_seen"] == 32 * (2 + 1 + 2 + 2 + 2 + 2)
    out = report.build(settings={}, main=main, injections=[], events=[], wall_s=1.0, detection_bound_s=1.0,
                       baseline=None, baseline_wall_s=None)
    assert out["checks"]["exactly_once"] and out["history"]["abandoned_steps"] == [3, 4]


def test_a_rollback_that_ends_on_two_states_is_a_divergence():
    rows = rolled_back_history()
    rows[-1]["digest"] = "f5"  # r1's commit of the last step
    problems = report.exactly_once(rows, R)
    assert problems == ["the run ended on 2 different states at step 5: ['e5', 'f5']"]


@pytest.mark.parametrize("mutate, problem", [
    # r1 trains its batch 0 again at step 2 although step 0 already included it
    (lambda rows: rows[:9] + [step("r0", 2, ["r0", "r1"], {"r0": 2, "r1": 0}, 3.0, 2.0)],
     "step 2 (ledger {'r0': 2}) trained from a state no commit of step 1 produced (they left ledgers "
     "[{'r0': 2, 'r1': 1}])"),
    # step 2 claims r1's batch 1 but r1 computed batch 3 then
    (lambda rows: rows[:8] + [trained("r1", 2, 3)] + rows[9:-1] + [dict(rows[-1], position=3)], "which trained [3]"),
    # two commits of step 2 disagree on what they included
    (lambda rows: rows[:10] + [step("r1", 2, ["r1"], {"r1": 1}, 3.0, 2.0)], "different contents"),
    # a step trained from a state no step 1 committed (r1's batch 0 was never committed)
    (lambda rows: [trained("r1", 2, 1), step("r0", 2, ["r1"], {"r1": 1}, 3.0, 2.0)],
     "step 2 (ledger {'r1': 1}) trained from a state no commit of step 1 produced"),
    (lambda rows: [], "no step was committed"),
])
def test_exactly_once_finds_violations(mutate, problem):
    problems = report.exactly_once(mutate(healthy_history()), R)
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize("digests, ok", [
    ({("r0", 0): "a", ("r1", 0): "a"}, True),
    ({("r0", 0): "a", ("r1", 0): "b"}, False),
    ({("r0", 0): "a"}, False),
])
def test_final_states(digests, ok):
    rows = [{"event": "done", "replica": r, "rank": k, "digest": d} for (r, k), d in digests.items()]
    assert report.final_states(rows, R, 1)[0] is ok


def test_loss_by_step_averages_healthy_leaders():
    assert report.loss_by_step(healthy_history()) == {0: 3.0, 1: 1.0, 2: 0.6}


def test_effective_training_time():
    # window 0..3 s, 2 replicas = 6 replica-seconds; committed healthy steps: r0 3 s, r1 2 s
    assert report.effective_training_time(healthy_history(), 2) == pytest.approx(5 / 6)
    assert report.effective_training_time([], 2) == 0.0


def test_effective_training_time_leaves_out_what_a_rollback_abandoned():
    # window 0..9 s x 2 replicas = 18; the chain's healthy steps: 5 (steps 0-2) + 6 (steps 3-5 again);
    # the abandoned first tries of steps 3 and 4 (4 replica-seconds) were trained for nothing
    assert report.effective_training_time(rolled_back_history(), 2) == pytest.approx(11 / 18)


EVENTS = [
    {"at": 99.0, "kind": "death", "subject": "r1", "message": "replica r1 became DEAD: old", "cause": "x"},
    {"at": 100.4, "kind": "death", "subject": "r1", "message": "replica r1 became DEAD: gone", "cause": "trainer_exit"},
    {"at": 100.5, "kind": "replica", "subject": "r0", "message": "replica r0 became HEALTHY: x", "cause": ""},
    {"at": 104.0, "kind": "replica", "subject": "r1", "message": "replica r1 became BEHIND: joined", "cause": ""},
    {"at": 105.0, "kind": "replica", "subject": "r1", "message": "replica r1 became HEALTHY: caught up", "cause": ""},
]


@pytest.mark.parametrize("events, detection, rejoin", [
    (EVENTS, 0.4, 5.0),
    (EVENTS[:4], 0.4, None),   # never healthy again
    (EVENTS[:1], None, None),  # a death before the failure does not count
])
def test_recovery_times(events, detection, rejoin):
    got = report.recovery({"injected_at": 100.0, "replica": "r1"}, events)
    assert got["detection_s"] == (detection if detection is None else pytest.approx(detection))
    assert got["rejoin_s"] == (rejoin if rejoin is None else pytest.approx(rejoin))


def test_build_report_checks_and_baseline_difference():
    main = report.summary(healthy_history() + [
        {"event": "done", "replica": r, "rank": 0, "digest": "d", "step": 3, "test_loss": 0.2, "test_acc": 0.9}
        for r in R], R, 1)
    base = dict(main, test_accuracy=0.95)
    out = report.build(settings={}, main=main, injections=[{"injected_at": 100.0, "replica": "r1",
                                                             "kind": "kill-trainer", "injected_step": 1}],
                       events=EVENTS, wall_s=10.0, detection_bound_s=4.5, baseline=base, baseline_wall_s=8.0)
    assert out["checks"] == {"exactly_once": True, "bitwise_identical": True, "all_failures_detected": True,
                             "detection_within_bound": True, "all_failures_rejoined": True,
                             "identical_after_every_commit": True, "lost_batches_served_again": True}
    assert report.passed(out)
    assert out["accuracy_difference"] == pytest.approx(-0.05)
    assert out["failures"][0]["detection_s"] == pytest.approx(0.4)
    slow = report.build(settings={}, main=main, injections=out["failures"][:1], events=EVENTS, wall_s=1.0,
                        detection_bound_s=0.3, baseline=None, baseline_wall_s=None)
    assert not slow["checks"]["detection_within_bound"] and slow["baseline"] is None


def test_a_host_evicted_before_its_fault_went_live_was_a_healthy_host():
    main = report.summary(healthy_history() + [
        {"event": "done", "replica": r, "rank": 0, "digest": "d", "step": 3, "test_loss": 0.2, "test_acc": 0.9}
        for r in R], R, 1)
    sdc = {"injected_at": 100.0, "replica": "r1", "kind": "sdc", "injected_step": 1, "host": "h1"}

    def evict(at: float, host: str = "h1") -> dict:
        return {"kind": "sdc", "at": at, "decided_at": at, "hosts": [host], "action": "evict", "action_host": host,
                "summary": f"host {host} holds differing state", "confidence": 0.95, "action_reason": "evict"}

    def checks(*diagnoses) -> dict:
        return report.build(settings={}, main=main, injections=[sdc], events=EVENTS, wall_s=1.0,
                            detection_bound_s=4.5, baseline=None, baseline_wall_s=None,
                            diagnoses=list(diagnoses))["checks"]
    assert checks(evict(101.0))["no_healthy_host_evicted"] and checks(evict(101.0))["faulty_hosts_evicted"]
    early = checks(evict(99.0))  # found while starting up, before the demo let its fault loose
    assert not early["no_healthy_host_evicted"] and not early["faulty_hosts_evicted"]
    assert not checks(evict(101.0), evict(102.0, "h0"))["no_healthy_host_evicted"]


def test_the_diagnosis_names_the_first_finding_and_the_confidence_it_was_evicted_with():
    sdc = {"injected_at": 100.0, "replica": "r2", "kind": "sdc", "injected_step": 1, "host": "h2"}
    tie = {"kind": "sdc", "at": 101.0, "hosts": ["h2"], "action": "report", "action_host": "h2",
           "summary": "host h2 holds differing state (tie)", "confidence": 0.475, "action_reason": "below"}
    acted = dict(tie, at=102.0, action="evict", confidence=0.95, summary="host h2 holds differing state")
    d = report.diagnosis_of(sdc, [acted, tie])
    assert d["found_s"] == 1.0 and d["finding"].endswith("(tie)") and d["first_confidence"] == 0.475
    assert d["evicted"] and d["action"] == "evict" and d["confidence"] == 0.95
    only_reported = report.diagnosis_of(sdc, [tie])
    assert not only_reported["evicted"] and only_reported["confidence"] == 0.475


def test_samples_seen_and_the_equal_samples_baseline():
    rows = healthy_history()
    assert report.samples_by_step(rows, 32) == {0: 64, 1: 96, 2: 160}  # 2, 1, 2 replicas included
    assert report.loss_by_samples(rows, 32) == {64: 3.0, 96: 1.0, 160: 0.6}
    assert report.baseline_steps_for(192, 2, 32) == 3 and report.baseline_steps_for(193, 2, 32) == 4
    assert report.mean_loss_near({64: 3.0, 96: 1.0, 160: 0.6}, 160, 70) == pytest.approx(0.8)
    assert report.mean_loss_near({64: 3.0}, 160, 10) is None


def test_comparison_states_the_seed_band():
    main = report.summary(healthy_history() + [
        {"event": "done", "replica": r, "rank": 0, "digest": "d", "step": 3, "test_loss": 0.2, "test_acc": 0.95}
        for r in R], R, 1, batch_rows=32)
    base = dict(main, test_accuracy=0.955, samples_seen=192)
    band = report.band_view({"config": {"replicas": 2, "steps": 3}, "seeds": [0, 1, 2],
                             "test_accuracy": [0.947, 0.958, 0.951], "final_train_loss": [0.1, 0.1, 0.1],
                             "measured_with": "python -m fthsdp.demo.band --seeds 0 1 2 --write"},
                            {"replicas": 2, "steps": 3, "seed": 9})
    assert band["test_accuracy_spread"] == pytest.approx(0.011) and band["applies"]
    out = report.build(settings={}, main=main, injections=[], events=[], wall_s=1.0, detection_bound_s=1.0,
                       baseline=base, baseline_wall_s=1.0, band=band, loss_window=None)
    c = out["comparison"]
    assert out["samples_seen"] == 160 and c["basis"] == "equal samples seen" and c["baseline_samples_seen"] == 192
    assert c["test_accuracy_difference"] == pytest.approx(-0.005) and c["difference_within_band"] is True
    assert "differs by -0.0050" in c["statement"] and "0.9470..0.9580 over seeds 0, 1, 2" in c["statement"]
    other = report.band_view({**band, "test_accuracy": [0.95, 0.951], "config": {"replicas": 4},
                              "measured_with": ""}, {"replicas": 2})
    assert not other["applies"]
    far = report.build(settings={}, main=main, injections=[], events=[], wall_s=1.0, detection_bound_s=1.0,
                       baseline=dict(base, test_accuracy=0.99), baseline_wall_s=1.0, band=band)
    assert far["comparison"]["difference_within_band"] is False


# -- semi-synchronous (diloco, H = 2): a sync commits H batches per contributor

def sync_row(replica, n, included, positions, t, pid, behind=False, digest=None, before="", quorum=1):
    return {"event": "commit", "replica": replica, "rank": 0, "pid": pid, "step": n, "included": included,
            "positions_before": positions, "t": t, "began": t - 1.0, "behind": behind, "loss": 1.0 / (n + 1),
            "batches": 2, "before": before, "digest": digest or f"g{n}", "quorum_id": quorum}


def inner(replica, n, position, pid, i):
    return {"event": "trained", "replica": replica, "rank": 0, "pid": pid, "step": n, "position": position,
            "inner": i, "t": 0.0}


def diloco_history():
    """r1 (pid 11) is killed in inner step 0 of the round before sync 1; its restart (pid 12)
    trains a round from scratch, catches up at sync 2, then trains the lost batch 2 again."""
    return [
        inner("r0", 0, 0, 10, 0), inner("r0", 0, 1, 10, 1), inner("r1", 0, 0, 11, 0), inner("r1", 0, 1, 11, 1),
        sync_row("r0", 0, ["r0", "r1"], {}, 1.0, 10), sync_row("r1", 0, ["r0", "r1"], {}, 1.0, 11),
        inner("r0", 1, 2, 10, 0), inner("r1", 1, 2, 11, 0), inner("r0", 1, 3, 10, 1),
        sync_row("r0", 1, ["r0"], {"r0": 2, "r1": 2}, 2.0, 10, before="g0", quorum=2),
        inner("r0", 2, 4, 10, 0), inner("r0", 2, 5, 10, 1), inner("r1", 0, 0, 12, 0), inner("r1", 0, 1, 12, 1),
        sync_row("r0", 2, ["r0"], {"r0": 4, "r1": 2}, 3.0, 10, before="g1", quorum=3),
        sync_row("r1", 2, ["r0"], {"r0": 4, "r1": 2}, 3.0, 12, behind=True, quorum=3),
        inner("r0", 3, 6, 10, 0), inner("r0", 3, 7, 10, 1), inner("r1", 3, 2, 12, 0), inner("r1", 3, 3, 12, 1),
        sync_row("r0", 3, ["r0", "r1"], {"r0": 6, "r1": 2}, 4.0, 10, before="g2", quorum=3),
        sync_row("r1", 3, ["r0", "r1"], {"r0": 6, "r1": 2}, 4.0, 12, before="g2", quorum=3),
    ] + [{"event": "done", "replica": r, "rank": 0, "pid": p, "digest": "g3", "step": 4, "test_loss": 0.2,
          "test_acc": 0.9} for r, p in (("r0", 10), ("r1", 12))]


KILL = {"kind": "kill-trainer", "replica": "r1", "pid": 11, "injected_at": 100.0, "injected_step": 1,
        "moment": "(inner step 1 of 2 before sync 1)"}


def test_a_diloco_run_commits_h_batches_per_contributor_and_serves_a_killed_replicas_lost_batches_again():
    main = report.summary(diloco_history(), R, 1, batch_rows=32, injections=[KILL], every=2)
    assert main["exactly_once"] and main["identical_after_every_commit"] and main["problems"] == []
    assert report.samples_by_step(diloco_history(), 32) == {0: 128, 1: 192, 2: 256, 3: 384}  # cumulative
    assert main["samples_seen"] == 384 and main["history"]["steps"] == 4
    [landed] = main["landings"]
    assert landed == {"step": 1, "lost_batches": [2], "served_again": True,
                      "text": "in inner step 0 of 2 before sync 1: batches 2..2 lost, served again"}
    out = report.build(settings={}, main=main, injections=[KILL], events=EVENTS, wall_s=1.0, detection_bound_s=1.0,
                       baseline=None, baseline_wall_s=None, sync={"mode": "diloco", "every_steps": 2, "text": "x"})
    assert out["checks"]["lost_batches_served_again"] and out["checks"]["identical_after_every_commit"]
    assert out["failures"][0]["lost_batches"] == [2] and out["sync"]["every_steps"] == 2


def test_a_diloco_record_that_skips_the_lost_batch_or_commits_two_states_fails_its_check():
    skipped = diloco_history()
    for row in skipped[-4:-2]:  # the last sync reads r1 at 3: batch 2 is never served again
        row["positions_before"] = {"r0": 6, "r1": 3}
    main = report.summary(skipped, R, 1, batch_rows=32, injections=[KILL], every=2)
    assert not main["exactly_once"] and not main["landings"][0]["served_again"]
    out = report.build(settings={}, main=main, injections=[KILL], events=EVENTS, wall_s=1.0, detection_bound_s=1.0,
                       baseline=None, baseline_wall_s=None)
    assert not out["checks"]["lost_batches_served_again"] and not report.passed(out)
    torn = diloco_history()
    torn[5]["digest"] = "h0"  # r1 committed sync 0 into another global state than r0 (same quorum)
    problems = report.identical_after_every_commit(torn)
    assert problems == ["step 0 (quorum 1) committed into different states: {'r0/0/10': 'g0', 'r1/0/11': 'h0'}"]
    assert not report.summary(torn, R, 1, every=2)["identical_after_every_commit"]


def test_the_states_an_sdc_fault_corrupts_are_left_to_the_diagnosis():
    rows = diloco_history()
    for row in rows:
        if row.get("pid") == 12 and row["event"] == "commit" and row["step"] == 3:
            row["digest"] = "flipped"  # r1's restarted process corrupts its state after the sdc went live
    assert report.identical_after_every_commit(rows) != []
    sdc = {"kind": "sdc", "replica": "r1", "injected_at": 3.5}  # pid 12 ran before it (t = 3.0)
    assert report.corrupting(rows, [sdc]) == {("r1", 11), ("r1", 12)}
    assert report.identical_after_every_commit(rows, [sdc]) == []
    assert report.identical_after_every_commit(rows, [{**sdc, "kind": "hang"}]) != []


def test_each_mode_and_h_is_compared_with_its_own_band():
    assert report.band_path() == report.BAND_FILE
    assert report.band_path("diloco", 8).name == "baseline_band_diloco_h8.json"
    band = report.band_view({"config": {"replicas": 4, "steps": 200, "sync_mode": "diloco", "sync_every": 8},
                             "seeds": [0, 1, 2], "test_accuracy": [0.94, 0.95, 0.96], "measured_with": ""},
                            {"replicas": 4, "steps": 200, "sync_mode": "diloco", "sync_every": 4})
    assert not band["applies"]  # measured for H = 8, not 4


def test_streaming_is_compared_with_the_band_of_its_own_fragments():
    from fthsdp.demo import band

    assert report.band_path("streaming_diloco", 8, 2).name == "baseline_band_streaming_diloco_h8_f2.json"
    assert report.band_path("streaming_diloco", 8, 1).name == "baseline_band_streaming_diloco_h8.json"
    cfg = band.config("streaming_diloco", 8, 2)
    assert (cfg["sync_mode"], cfg["sync_every"], cfg["sync_fragments"]) == ("streaming_diloco", 8, 2)
    run_settings = {**band.CONFIG, "sync_mode": "streaming_diloco", "sync_every": 8, "sync_fragments": 4}
    view = report.band_view({"config": cfg, "seeds": [0, 1], "test_accuracy": [0.9, 0.91], "measured_with": ""},
                            run_settings)
    assert not view["applies"]  # measured for F = 2, not 4
    with pytest.raises(SystemExit):  # F that does not divide H: argparse's error, nothing measured
        band.main(["--sync", "streaming_diloco", "--sync-every", "8", "--sync-fragments", "3", "--seeds", "0", "1"])
