"""The telemetry ring between a trainer (fthsdp.telemetry) and its agent (agent.telemetry):
a real file written by the writer and read back, bad files refused, summaries on a fake clock."""

from __future__ import annotations

import os
import threading

import pytest

from agent.telemetry import Collector, RingError, own_times, read_ring, summarize_rank
from fthsdp.telemetry import Collectives, Kind, Telemetry
from protos import telemetry_ring as ring

S = 1e9  # ns per second


def make(tmp_path, capacity=64, replica="r1", rank=3):
    return Telemetry.create(tmp_path / "slot-0.ring", replica_id=replica, rank=rank, now=100.0, capacity=capacity)


def test_roundtrip_join_progress_done(tmp_path):
    t = make(tmp_path)
    a = t.record_join(0, Kind.ALL_REDUCE, "replica", 1000, 101.0, group_size=4)
    t.record_progress(a, 400, 101.5)
    t.record_done(a, 102.0)
    b = t.record_join(0, Kind.FTAR_ALL_REDUCE, "ftar.q1", 500, 102.25, group_size=3)
    header, records = read_ring(t.path)
    assert (header.replica_id, header.rank, header.appended, header.capacity) == ("r1", 3, 2, 64)
    first, second = records
    assert (first.kind, first.state, first.seq, first.group, first.group_size) == (
        Kind.ALL_REDUCE, ring.State.DONE, 0, "replica", 4)
    assert (first.join_ns, first.progress_ns, first.done_ns, first.progress_bytes) == (101 * S, 101.5 * S, 102 * S, 400)
    assert second.index == b and second.state == ring.State.JOINED and second.done_ns == 0
    assert second.kind.cross_replica and not first.kind.cross_replica
    assert os.stat(t.path).st_mode & 0o777 == 0o600
    assert os.path.getsize(t.path) == ring.ring_bytes(64) < ring.MAX_RING_BYTES


def test_the_ring_keeps_the_newest_capacity_records_and_ignores_overwritten_tokens(tmp_path):
    t = make(tmp_path, capacity=4)
    tokens = [t.record_join(i, Kind.BARRIER, "replica", 0, 101.0 + i, group_size=2) for i in range(10)]
    t.record_done(tokens[0], 200.0)  # overwritten long ago: must not touch the slot's new record
    header, records = read_ring(t.path)
    assert header.appended == 10 and [r.seq for r in records] == [6, 7, 8, 9]
    assert all(r.state == ring.State.JOINED for r in records)


def test_default_ring_is_under_one_mebibyte_and_capacity_is_bounded(tmp_path):
    assert ring.ring_bytes(ring.DEFAULT_CAPACITY) < 1 << 20 and ring.ring_bytes(ring.MAX_CAPACITY) <= 1 << 20
    with pytest.raises(ValueError, match=f"capacity must be 1..{ring.MAX_CAPACITY}"):
        make(tmp_path, capacity=ring.MAX_CAPACITY + 1)


@pytest.mark.parametrize("group, seq, nbytes, size, text", [
    ("", 0, 0, 1, "must be 1..32 characters"),
    ("x" * 33, 0, 0, 1, "must be 1..32 characters"),
    ("bad group", 0, 0, 1, "letters, digits"),
    ("ok", -1, 0, 1, "seq >= 0"),
    ("ok", 0, -5, 1, "nbytes >= 0"),
    ("ok", 0, 0, 0, "group_size >= 1"),
])
def test_bad_records_are_refused_and_write_nothing(tmp_path, group, seq, nbytes, size, text):
    t = make(tmp_path)
    with pytest.raises(ValueError, match=text):
        t.record_join(seq, Kind.ALL_REDUCE, group, nbytes, 101.0, group_size=size)
    assert read_ring(t.path)[0].appended == 0


@pytest.mark.parametrize("damage, text", [
    (lambda b: b"NOTARING" + b[8:], "magic"),
    (lambda b: b[:100], "shorter than its 128-byte header"),
    (lambda b: b + b"\0" * 96, "records need"),
    (lambda b: b[:8] + (2).to_bytes(4, "little") + b[12:], "layout 2"),
    (lambda b: b[:16] + (10 ** 6).to_bytes(4, "little") + b[20:], "capacity must be"),
])
def test_malformed_rings_are_refused_naming_the_problem(tmp_path, damage, text):
    t = make(tmp_path)
    t.record_join(0, Kind.ALL_REDUCE, "replica", 1, 101.0, group_size=2)
    path = tmp_path / "slot-0.ring"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(RingError, match=text):
        read_ring(path)


def test_garbage_records_are_skipped_and_a_missing_file_is_an_error(tmp_path):
    t = make(tmp_path)
    t.record_join(0, Kind.ALL_REDUCE, "replica", 1, 101.0, group_size=2)
    t.record_join(1, Kind.ALL_REDUCE, "replica", 1, 102.0, group_size=2)
    raw = bytearray((tmp_path / "slot-0.ring").read_bytes())
    at = ring.record_offset(64, 0)
    raw[at + 4] = 200  # an unknown kind
    (tmp_path / "slot-0.ring").write_bytes(bytes(raw))
    assert [r.seq for r in read_ring(t.path)[1]] == [1]
    with pytest.raises(RingError, match="cannot open"):
        read_ring(tmp_path / "absent.ring")


def test_a_record_being_written_is_left_out(tmp_path):
    t = make(tmp_path)
    t.record_join(0, Kind.ALL_REDUCE, "replica", 1, 101.0, group_size=2)
    at = ring.record_offset(64, 0)
    ring.U32.pack_into(t._mm, at, 7)  # odd version: the writer is in the middle of it
    assert read_ring(t.path)[1] == []


def test_concurrent_writer_never_yields_a_torn_record(tmp_path):
    t = make(tmp_path, capacity=8)
    stop = threading.Event()

    def write():
        seq = 0
        while not stop.is_set():
            tok = t.record_join(seq, Kind.ALL_REDUCE, "replica", seq, 101.0 + seq, group_size=2)
            t.record_progress(tok, seq, 101.0 + seq)
            t.record_done(tok, 101.5 + seq)
            seq += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(100):  # each read races the writer's 8-slot ring several times over
            for r in read_ring(t.path)[1]:
                # every field of a record comes from the same write of it
                assert r.nbytes == r.seq and r.join_ns == int((101.0 + r.seq) * S)
                assert r.progress_bytes in (0, r.seq)
                assert r.state == ring.State.JOINED or r.done_ns == int((101.5 + r.seq) * S)
    finally:
        stop.set()
        writer.join()


def test_own_time_counts_from_the_previous_event_not_a_late_release(tmp_path):
    t = make(tmp_path)
    a = t.record_join(0, Kind.ALL_REDUCE, "replica", 1, 101.0, group_size=2)
    t.record_done(a, 105.0)  # waited 4 s for someone else
    b = t.record_join(1, Kind.ALL_REDUCE, "replica", 1, 105.5, group_size=2)  # 0.5 s of own work
    t.record_done(b, 106.0)
    c = t.record_join(0, Kind.FTAR_ALL_REDUCE, "ftar.q1", 1, 106.1, group_size=3)
    _, records = read_ring(t.path)
    assert own_times(records) == {b: int(0.5 * S), c: int(0.1 * S)}


def test_summary_pending_windows_and_already_sent_windows(tmp_path):
    t = make(tmp_path)
    now = 101.0
    for seq in range(4):  # two complete windows of 2: own 0.2 s each collective, wait 0.3 s
        tok = t.record_join(seq, Kind.ALL_REDUCE, "replica", 8, now + 0.2, group_size=4)
        t.record_done(tok, now + 0.5)
        now += 0.5
    stuck = t.record_join(4, Kind.ALL_REDUCE, "replica", 1000, now + 0.2, group_size=4)
    t.record_progress(stuck, 100, now + 0.4)
    header, records = read_ring(t.path)
    s = summarize_rank("r1", 3, header, records, int((now + 10.2) * S), 2)
    [g] = s.groups
    assert (g.group, g.size, g.last_joined_seq, g.last_done_seq, g.pending_seq) == ("replica", 4, 4, 3, 4)
    assert g.pending_s == pytest.approx(10.0) and g.pending_idle_s == pytest.approx(9.8)
    assert (g.pending_nbytes, g.pending_sent_bytes) == (1000, 100)
    # window 0 lacks the own time of its first collective (nothing came before it)
    assert [w.index for w in g.windows] == [1]
    assert g.windows[0].own_s == pytest.approx(0.4) and g.windows[0].wait_s == pytest.approx(0.6)
    assert s.idle_s == pytest.approx(9.8) and s.recording_s == pytest.approx(now + 10.2 - 100)
    assert not summarize_rank("r1", 3, header, records, int(now * S), 2, {"replica": 1}).groups[0].windows


def test_collector_checks_identity_and_resends_until_delivered(tmp_path):
    t = make(tmp_path)
    for seq in range(7):  # windows of 2: 0 has no own time for #0, 1 and 2 are complete, 3 is open
        tok = t.record_join(seq, Kind.ALL_REDUCE, "replica", 8, 101.0 + seq, group_size=4)
        t.record_done(tok, 101.5 + seq)
    c = Collector("h1", 2)
    wrong = c.collect([(0, "r9", 0, str(t.path)), (1, "r1", 4, str(tmp_path / "none.ring"))], int(200 * S))
    assert not wrong.ranks and "belongs to r1/3" in c.problems[0] and "cannot open" in c.problems[1]
    first = c.collect([(0, "r1", 3, str(t.path))], int(200 * S))
    assert [w.index for w in first.ranks[0].groups[0].windows] == [1, 2]
    again = c.collect([(0, "r1", 3, str(t.path))], int(200 * S))  # not delivered: sent again
    assert [w.index for w in again.ranks[0].groups[0].windows] == [1, 2]
    c.delivered()
    assert not c.collect([(0, "r1", 3, str(t.path))], int(200 * S)).ranks[0].groups[0].windows


def test_sparse_seqs_form_windows_once_the_rank_moved_past_them(tmp_path):
    """A runtime may number collectives by step (8 per step, 4 used): windows still close."""
    t = make(tmp_path)
    now = 101.0
    for step in range(5):
        for pos in range(4):
            tok = t.record_join(8 * step + pos, Kind.ALL_REDUCE, "replica", 8, now + 0.1, group_size=2)
            t.record_done(tok, now + 0.2)
            now += 0.2
    header, records = read_ring(t.path)
    [g] = summarize_rank("r1", 3, header, records, int((now + 1) * S), 16).groups
    assert [w.index for w in g.windows] == [1] and g.windows[0].own_s == pytest.approx(0.8)


def test_a_disturbed_record_marks_its_window_and_only_that_one(tmp_path):
    t = make(tmp_path)
    now = 101.0
    for seq in range(8):  # windows of 2; the record of seq 4 was joined after uneven work
        tok = t.record_join(seq, Kind.ALL_REDUCE, "replica", 8, now + 0.1, group_size=2, disturbed=seq == 4)
        t.record_done(tok, now + 0.2)
        now += 0.2
    header, records = read_ring(t.path)
    assert [r.seq for r in records if r.disturbed] == [4]
    [g] = summarize_rank("r1", 3, header, records, int((now + 1) * S), 2).groups
    assert [(w.index, w.disturbed) for w in g.windows] == [(1, False), (2, True)]


def test_flag_bits_the_reader_does_not_know_are_ignored(tmp_path):
    raw = bytearray(ring.pack_record(2, Kind.ALL_REDUCE, ring.State.JOINED, 0, 10, 8, 2, b"replica", disturbed=True))
    assert ring.unpack_record(0, bytes(raw)).disturbed
    raw[6:8] = (0xFFFE).to_bytes(2, "little")  # every bit but "disturbed"
    assert not ring.unpack_record(0, bytes(raw)).disturbed


def test_collectives_mark_uneven_work_up_to_the_next_plan_and_a_new_quorum(tmp_path):
    t, clock = make(tmp_path), iter(range(200, 400)).__next__
    c = Collectives(t, 2, clock=lambda: float(clock()))

    def step(n, quorum=1, disturb_at=None):
        c.begin(n)
        c.planned(n)
        if disturb_at == "serving":
            c.disturb()
        c.done(c.join(Kind.ALL_REDUCE, 8))
        c.done(c.join_ftar(quorum, 3, 8))
        c.vote()
        c.decided()
        if disturb_at == "checkpoint":
            c.disturb()

    step(0)
    step(1, disturb_at="checkpoint")   # the write lands in step 2's plan
    step(2)
    step(3, disturb_at="serving")      # the rest of step 3, and step 4's plan
    step(4)
    step(5, quorum=2)                  # a new ring: from its FTAR op to step 6's plan
    step(6, quorum=2)
    _, records = read_ring(t.path)
    marked = [(r.seq // Collectives.INTRA_PER_STEP if r.group == "replica" else r.seq // Collectives.FTAR_PER_STEP,
               r.kind.name) for r in records if r.disturbed]
    assert marked == [(2, "BARRIER"), (3, "ALL_REDUCE"), (3, "FTAR_ALL_REDUCE"), (3, "VOTE"), (4, "BARRIER"),
                      (5, "FTAR_ALL_REDUCE"), (5, "VOTE"), (6, "BARRIER")]
