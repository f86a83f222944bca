"""The --failures schedule parser: table tests (pure)."""

from __future__ import annotations

import pytest

from fthsdp.demo.schedule import Failure, ScheduleError, default_text, moment, parse, placement, steps_per_sync


@pytest.mark.parametrize("text, expected", [
    ("", []),
    ("  ", []),
    ("kill-trainer@40:r1", [Failure("kill-trainer", 40, "r1")]),
    ("kill-agent@90:r2, kill-trainer@40:r1", [Failure("kill-trainer", 40, "r1"), Failure("kill-agent", 90, "r2")]),
    ("kill-trainer@1:r0,", [Failure("kill-trainer", 1, "r0")]),
    ("kill-trainer@160:r3", [Failure("kill-trainer", 160, "r3")]),  # 80% of 200
    ("hang-trainer@30:r2", [Failure("hang-trainer", 30, "r2")]),
])
def test_valid_schedules(text, expected):
    assert parse(text, replicas=4, steps=200, spares=1) == expected


@pytest.mark.parametrize("text, named, why", [
    ("kill-trainer@40", "kill-trainer@40", "KIND@STEP:REPLICA"),
    ("explode@40:r1", "explode@40:r1", "unknown kind 'explode'"),
    ("kill-trainer@x:r1", "kill-trainer@x:r1", "KIND@STEP:REPLICA"),
    ("kill-trainer@0:r1", "kill-trainer@0:r1", "outside 1..160"),
    ("kill-trainer@161:r1", "kill-trainer@161:r1", "outside 1..160"),
    ("kill-trainer@40:r9", "kill-trainer@40:r9", "replica 'r9'"),
    ("kill-agent@40:r1,kill-agent@60:r2", "kill-agent@60:r2", "only 1 spare"),
    ("kill-agent@40:r1,kill-trainer@40:r2", "kill-agent@40:r1", "same step"),
    ("kill-trainer@40:r1;kill-agent@60:r2", "kill-trainer@40:r1;kill-agent@60:r2", "KIND@STEP:REPLICA"),
])
def test_bad_schedules_name_the_entry(text, named, why):
    with pytest.raises(ScheduleError) as err:
        parse(text, replicas=4, steps=200, spares=1)
    assert repr(named) in str(err.value) and why in str(err.value)


def test_no_spares_means_no_agent_kills():
    with pytest.raises(ScheduleError, match="only 0 spare"):
        parse("kill-agent@10:r0", replicas=2, steps=100, spares=0)


@pytest.mark.parametrize("replicas, steps, spares, text", [
    (4, 200, 1, "kill-trainer@50:r1,kill-agent@130:r2"),
    (2, 40, 1, "kill-trainer@10:r1,kill-agent@26:r1"),
    (3, 10, 0, "kill-trainer@2:r1"),
])
def test_default_schedule_fits_the_run(replicas, steps, spares, text):
    assert default_text(replicas=replicas, steps=steps, spares=spares) == text
    assert parse(text, replicas=replicas, steps=steps, spares=spares)


@pytest.mark.parametrize("replicas, steps, spares, every, text", [
    (4, 200, 1, 8, "kill-agent@48:r2,kill-trainer@132:r1"),  # the host in sync 5, the trainer mid-round
    (3, 96, 1, 8, "kill-agent@24:r2,kill-trainer@60:r1"),
    (4, 200, 0, 8, "kill-trainer@52:r1"),
    (4, 16, 1, 8, "kill-agent@8:r2,kill-trainer@12:r1"),
    (4, 10, 1, 8, "kill-trainer@4:r1"),  # no sync before the trainer's round: the host is left out
    (4, 200, 1, 2, "kill-agent@50:r2,kill-trainer@131:r1"),
])
def test_semi_synchronous_default_kills_a_host_in_a_sync_and_a_trainer_between_syncs(replicas, steps, spares,
                                                                                     every, text):
    assert default_text(replicas=replicas, steps=steps, spares=spares, every=every) == text
    failures = parse(text, replicas=replicas, steps=steps, spares=spares)
    assert [placement(f.at_step, every)[1] == 0 for f in failures] == [f.kind == "kill-agent" for f in failures]


@pytest.mark.parametrize("step, every, where, words", [
    (52, 8, (6, 4), "(inner step 4 of 8 before sync 6)"),
    (48, 8, (5, 0), "(during sync 5)"),
    (8, 8, (0, 0), "(during sync 0)"),
    (1, 8, (0, 1), "(inner step 1 of 8 before sync 0)"),
    (40, 1, (40, 0), "(during sync 40)"),  # every step is a sync
])
def test_placement_of_a_failure_in_a_round_or_a_sync(step, every, where, words):
    assert placement(step, every) == where and moment(step, every) == words


@pytest.mark.parametrize("sync_every, fragments, k", [(8, 1, 8), (8, 2, 4), (8, 8, 1), (1, 1, 1), (12, 3, 4)])
def test_a_sync_is_k_training_steps_h_or_h_over_f_with_fragments(sync_every, fragments, k):
    assert steps_per_sync(sync_every, fragments) == k


def test_streaming_failures_are_placed_in_syncs_of_one_fragment_every_k_steps():
    """--sync streaming_diloco --sync-every 8 --sync-fragments 2, 96 training steps: a sync every
    K = 4 (24 of them); the default host kill lands in a sync, the trainer's in an inner step of K."""
    k = steps_per_sync(8, 2)
    text = default_text(replicas=3, steps=96, spares=1, every=k)
    assert text == "kill-agent@24:r2,kill-trainer@62:r1"
    host, trainer = parse(text, replicas=3, steps=96, spares=1)
    assert placement(host.at_step, k) == (5, 0) and moment(host.at_step, k) == "(during sync 5)"
    assert placement(trainer.at_step, k) == (15, 2)
    assert moment(trainer.at_step, k) == "(inner step 2 of 4 before sync 15)"
    assert placement(20, k) == (4, 0) and placement(8, 8) == (0, 0)  # in sync 4 with K = 4, in sync 0 with K = H
