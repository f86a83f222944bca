"""fthsdp.process_group's rules (race 2 of issue 28): which store a rank joins, and the bounded
redial on a fake clock. The race itself, on real processes: test_race_rendezvous.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fthsdp import process_group
from fthsdp.process_group import RendezvousTimeout, StaleStore, retry_until, stale_store


@pytest.mark.parametrize("own, rank0, formed, joins", [
    (7, 7, False, True),    # one restart's ranks (a swap, a replica restart)
    (7, 7, True, True),     # ... also once rank 0's group formed (it has not: this rank is in it)
    (7, 3, True, False),    # the old rank 0, stopping: its group formed without this rank
    (4, 3, False, True),    # a first layout: rank 0's host got its version first
    (3, 7, False, False),   # this rank is the stale one
    (3, 7, True, False),
])
def test_which_store_a_rank_joins(own, rank0, formed, joins):
    why = stale_store(own, rank0, formed)
    assert (why is None) == joins
    if why:
        assert str(rank0) in why and str(own) in why


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def pause(self, s: float) -> None:
        self.now += s


def test_a_stale_or_reset_store_is_dialled_again_until_the_new_one_answers():
    clock, tries = FakeClock(), []

    def attempt(remaining_s: float) -> str:
        tries.append(remaining_s)
        clock.now += 2.0  # one probe
        if len(tries) == 1:
            raise StaleStore("the store at h:1 is not this rank's: ...")
        if len(tries) == 2:
            raise RuntimeError("Connection reset by peer")
        return "store"

    assert retry_until(attempt, 30, "rank 1 reaching h:1", clock=clock, pause=clock.pause) == "store"
    assert tries == pytest.approx([30, 28 - process_group.RETRY_PAUSE_S, 26 - 2 * process_group.RETRY_PAUSE_S])


def test_the_wait_is_bounded_and_names_what_timed_out_and_the_last_error():
    clock = FakeClock()

    def attempt(remaining_s: float) -> None:
        clock.now += min(2.0, remaining_s)
        raise RuntimeError(f"wait timeout after {min(2.0, remaining_s) * 1000:.0f}ms")

    with pytest.raises(RendezvousTimeout, match=r"timed out after 9 s \(5 tries\) rank 1 of replica version 7 "
                                                r"reaching .*; last error: wait timeout after 600ms"):
        retry_until(attempt, 9, "rank 1 of replica version 7 reaching its rank 0's store at h:1",
                    clock=clock, pause=clock.pause)
    assert clock.now <= 100 + 9 + process_group.RETRY_PAUSE_S


def test_an_error_that_is_no_store_error_is_not_retried():
    clock, tries = FakeClock(), []

    def attempt(remaining_s: float) -> None:
        tries.append(remaining_s)
        raise ValueError("port out of range")

    with pytest.raises(ValueError, match="port out of range"):
        retry_until(attempt, 30, "x", clock=clock, pause=clock.pause)
    assert len(tries) == 1


def test_a_replica_version_that_is_no_integer_is_refused_naming_it(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.setenv("FTHSDP_REPLICA_VERSION", "seven")
    with pytest.raises(ValueError, match="FTHSDP_REPLICA_VERSION must be an integer, got 'seven'"):
        process_group.init_replica_group("gloo", 1, 2, timedelta(seconds=1))
