"""The --failures schedule parser: table tests (pure)."""

from __future__ import annotations

import pytest

from fthsdp.demo.schedule import Failure, ScheduleError, default_text, parse


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
