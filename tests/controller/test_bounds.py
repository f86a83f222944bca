"""The pure bounds: text cutting, section sizes, the shard budget, the step-down rule."""

import json

import pytest

from controller.core.checks import CUT_MARKER, MAX_INT, check_finite, check_non_negative, clip_text
from controller.core.errors import FailedPrecondition, InvalidArgument
from controller.core.host_records import HOST_SHARDS, host_shard
from controller.core.model import Assignment
from controller.core.sizes import encode_section, fit_journal, value_limit, worst_replica_record_bytes
from controller.core.store_health import WriteStreak
from controller.settings import ControllerSettings
from tests.controller.drive import Driver


@pytest.mark.parametrize("length", [0, 63, 64, 65, 100, 10_000, 3_000_000])
def test_clip_text_keeps_short_text_and_cuts_long_text_to_the_bound(length):
    text = "a" * length
    out = clip_text(text, 64)
    assert len(out) <= 64
    if length <= 64:
        assert out == text
    else:
        cut = int(out.rsplit("[", 1)[1].split()[0])
        assert out.endswith("more characters cut]") and len(out) - len(CUT_MARKER.format(n=cut)) + cut == length


def test_clip_text_makes_one_printable_line_of_at_most_six_json_bytes_a_character():
    out = clip_text("bad\nline\x00\U0001F600€", 64)
    assert out == "bad line \ufffd€"
    assert len(json.dumps(clip_text("\U0001F600" * 100, 64))) <= 2 + 6 * 64


@pytest.mark.parametrize("value, ok", [(0, True), (MAX_INT, True), (MAX_INT + 1, False), (-1, False)])
def test_integers_stay_exact_in_json(value, ok):
    if ok:
        assert check_non_negative("step", value) == value
    else:
        with pytest.raises(InvalidArgument, match=f"step.*{value}"):
            check_non_negative("step", value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_floats_are_refused(value):
    with pytest.raises(InvalidArgument, match="must be a finite number"):
        check_finite("loss", value)


def test_the_journal_drops_its_oldest_entries_until_it_fits():
    events = [[float(i), "k", "s", "m" * 100, ""] for i in range(100)]
    history = [{"quorum_id": i, "reason": "r" * 100} for i in range(20)]
    snapshot = {"version": 1, "history": history, "events": events, "event_seq": 107}
    fitted, dropped = fit_journal(snapshot, 4000)
    assert len(encode_section(fitted)) <= 4000 and dropped > 0
    assert fitted["events"] == events[-len(fitted["events"]):] and fitted["history"] == history[-len(fitted["history"]):]
    assert fitted["event_seq"] == 107  # what else the journal holds is kept
    assert fit_journal(snapshot, 10**6) == (snapshot, 0)


def test_a_shard_that_would_outgrow_one_store_write_refuses_the_next_host():
    s = Driver(ControllerSettings(store_max_request_bytes=64 * 1024, max_id_chars=32, max_reason_chars=64))
    labels = {f"k{i}": "v" * 30 for i in range(32)}
    registered = 0
    with pytest.raises(FailedPrecondition, match="its shard .* would need up to .* bytes"):
        for i in range(10_000):
            s.register(f"h{i}", "i", 0.0, spare=True, labels=labels)
            registered += 1
    before = len(s.view.hosts)
    assert before == registered and 0 < registered < 10_000
    for shard in range(HOST_SHARDS):  # every shard, fully grown, still fits
        hosts = [h for h in s.view.hosts.values() if host_shard(h.host_id) == shard]
        for h in hosts:
            h.cordon_reason = "\u20ac" * 512
        assert len(encode_section(s.view.snapshot_hosts(shard))) <= value_limit(s.settings)


def test_too_many_hosts_are_refused():
    s = Driver(ControllerSettings(max_hosts=2))
    s.register("a", "i", 0.0, spare=True)
    s.register("b", "i", 0.0, spare=True)
    with pytest.raises(FailedPrecondition, match="host c is one too many.*at most 2 hosts"):
        s.register("c", "i", 0.0, spare=True)
    s.register("a", "j", 100.0, spare=True)  # a known host may register again


def test_settings_whose_replicas_section_could_outgrow_the_store_are_refused():
    ControllerSettings(replicas=20).validate()
    with pytest.raises(ValueError, match="replicas section could reach .* bytes"):
        ControllerSettings(replicas=60).validate()
    ControllerSettings(replicas=60, max_id_chars=32, max_reason_chars=256).validate()
    assert worst_replica_record_bytes(ControllerSettings()) > 6 * 1024  # a reason of 1024 × 6 bytes


@pytest.mark.parametrize("field, value", [("max_reason_chars", 10), ("store_max_request_bytes", 100),
                                          ("store_failing_s_to_step_down", float("nan")),
                                          ("store_failed_writes_to_step_down", 0), ("max_world_size", 1 << 30)])
def test_bound_settings_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        ControllerSettings(**{field: value}).validate()


def test_the_leader_steps_down_after_failures_in_a_row_or_for_long():
    streak = WriteStreak()
    rule = dict(max_failures=3, max_failing_s=10.0)
    assert streak.step_down_reason(0.0, **rule) is None
    streak.failed("a: too large", 0.0)
    streak.failed("a: too large", 1.0)
    assert streak.step_down_reason(1.0, **rule) is None
    streak.succeeded()  # one good write ends the streak
    streak.failed("b: down", 2.0)
    assert streak.step_down_reason(11.9, **rule) is None
    assert "failed for 10.0s" in streak.step_down_reason(12.0, **rule)
    streak.failed("b: down", 12.5)
    streak.failed("b: down", 12.6)
    assert streak.step_down_reason(12.6, **rule).startswith("3 store writes failed in a row")


def test_the_incrementally_encoded_host_shard_is_the_snapshot_byte_for_byte():
    s = Driver(ControllerSettings(replicas=2, min_replicas=1))
    for i in range(300):
        s.register(f"h{i}", "i", 0.0, spare=i % 3 == 0, labels={"zone": f"z{i % 4}"},
                         assignment=None if i % 3 == 0 else Assignment(f"r{i % 2}", (i,), 1000))
    shards = range(HOST_SHARDS)
    assert [s.view.encoded_host_shard(i) for i in shards] == [encode_section(s.view.snapshot_hosts(i)) for i in shards]
    s.drain("h1", 1.0)  # changes (cordon, swap) re-encode the hosts they touch
    s.cordon("h2", "changed", 1.1)  # every change of a host is followed by its touch
    assert [s.view.encoded_host_shard(i) for i in shards] == [encode_section(s.view.snapshot_hosts(i)) for i in shards]
    t = Driver.restored(s.settings, s.view.snapshot_replicas(), [s.view.snapshot_hosts(i) for i in shards], 5.0)
    assert [t.view.encoded_host_shard(i) for i in shards] == [s.view.encoded_host_shard(i) for i in shards]
