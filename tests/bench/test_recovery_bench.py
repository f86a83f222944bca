"""bench.recovery's numbers from commit records (made-up rows: the arithmetic, not the speed)."""

from bench.recovery import measure_rows, split_rounds

REPLICAS = ["r0", "r1", "r2"]


def commit(replica, t, behind=False, rank=0, step=None, began=None):
    return {"event": "commit", "replica": replica, "rank": rank, "t": t, "behind": behind,
            "step": int(t) if step is None else step, "began": t - 0.5 if began is None else began}


def test_a_failure_that_the_survivors_ride_out_and_the_replica_comes_back_from():
    rows = [commit(r, t) for r in REPLICAS for t in (1.0, 2.0, 3.0)]          # a step a second
    rows += [commit("r0", 5.0), commit("r2", 5.5), commit("r0", 6.0), commit("r2", 6.5)]  # survivors stall
    rows += [commit("r1", 6.0, behind=True), commit("r1", 7.0)]                # catch-up, then a trained step
    rows += [commit("r1", 7.0, rank=1)]                                         # other ranks do not count twice
    got = measure_rows(sorted(rows, key=lambda r: r["t"]), injected_at=3.5, replicas=REPLICAS, failed="r1")
    assert got["step_period_s"] == 1.0
    assert got["survivor_stall_s"] == 2.0          # r2's next commit at 5.5
    assert got["replica_down_s"] == 3.5            # r1 trained again at 7.0 (the catch-up at 6.0 trained nothing)
    # window 3.5 s per replica: r0 trained 2 steps, r2 2, r1 1 -> lost 1.5 + 1.5 + 2.5
    assert got["lost_replica_s"] == 5.5 and got["window_s"] == 3.5


def test_a_replica_that_never_comes_back_is_down_to_the_end_of_the_records():
    rows = [commit(r, t) for r in REPLICAS for t in (1.0, 2.0)] + [commit("r0", 4.0), commit("r2", 4.0)]
    got = measure_rows(sorted(rows, key=lambda r: r["t"]), injected_at=2.5, replicas=REPLICAS, failed="r1")
    assert got["replica_down_s"] is None and got["survivor_stall_s"] == 1.5 and got["window_s"] == 1.5


def test_a_survivor_that_joined_while_the_round_it_missed_trained_is_a_split_round():
    """Race 7 of issue 28: r0 and r2 rejoin 5 ms apart, the round closes with r0 alone, and r2
    catches up step 11 instead of training it."""
    rows = [commit(r, t, step=int(t)) for r in REPLICAS for t in (1.0, 2.0)]
    rows += [commit("r0", 10.5, step=10, began=9.0), commit("r0", 11.0, step=11)]
    rows += [commit("r2", 11.0, step=11, behind=True, began=9.005)]  # joined before r0's step 10 committed
    got = measure_rows(sorted(rows, key=lambda r: r["t"]), injected_at=2.5, replicas=REPLICAS, failed="r1")
    assert got["survivor_catch_ups"] == 1 and got["split_rounds"] == 1


def test_a_survivor_that_came_after_the_round_committed_caught_up_for_another_reason():
    rows = [commit("r0", 10.5, step=10), commit("r0", 11.0, step=11),
            commit("r2", 11.0, step=11, behind=True, began=10.6)]  # r0's step 10 had committed at 10.5
    assert split_rounds(rows, 2.5, ["r0", "r2"]) == (1, 0)
    assert split_rounds(rows, 11.5, ["r0", "r2"]) == (0, 0)  # before the failure: not counted
