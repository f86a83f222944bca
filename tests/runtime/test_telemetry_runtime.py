"""The runtime records its collectives in the ring the agent reads: one replica's Manager in this
process against a real controller, the ring read back with the agent's own reader."""

from __future__ import annotations

from agent.telemetry import read_ring, summarize_rank
from fthsdp.telemetry import ENV_TELEMETRY_FILE, Collectives, Kind
from protos.telemetry_ring import State
from tests.runtime.test_manager_in_process import _manager, _train, controller  # noqa: F401 - fixture

P = Collectives.INTRA_PER_STEP


def test_every_step_records_its_plan_ftar_op_and_vote(controller, tmp_path, monkeypatch):  # noqa: F811
    ring = tmp_path / "slot-0.ring"
    monkeypatch.setenv(ENV_TELEMETRY_FILE, str(ring))
    manager, model, opt = _manager(controller, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every_steps=2)
    manager.start()
    try:
        assert _train(manager, model, opt, 3) == [True] * 3
        quorum = manager.last_outcome.quorum_id
    finally:
        manager.close()
    header, records = read_ring(ring)
    assert (header.replica_id, header.rank) == ("0", 0)
    seen = [(r.group, r.kind, r.seq) for r in records if r.state == State.DONE]
    for step in range(3):
        assert ("replica", Kind.BARRIER, step * P) in seen          # begin -> plan
        assert (f"ftar.q{quorum}", Kind.FTAR_ALL_REDUCE, step * Collectives.FTAR_PER_STEP) in seen
        assert ("replica", Kind.VOTE, (step + 1) * P - 1) in seen   # vote -> decision
    # the checkpoint written after step 1 lies in step 2's plan (begin -> plan): only it is disturbed
    assert [(r.kind, r.seq) for r in records if r.disturbed] == [(Kind.BARRIER, 2 * P)]
    ftar = [r for r in records if r.kind == Kind.FTAR_ALL_REDUCE]
    assert all(r.group_size == 1 and r.nbytes > 0 for r in ftar)
    # the agent's summary of it: nothing pending, a complete window of the replica's group
    summary = summarize_rank("0", 0, header, records, records[-1].last_event_ns + 10**9, P)
    groups = {g.group: g for g in summary.groups}
    assert groups["replica"].pending_seq == -1 and [w.index for w in groups["replica"].windows] == [1]


def _trains_one_step_without_telemetry(controller) -> None:  # noqa: F811
    manager, model, opt = _manager(controller)
    manager.start()
    try:
        assert manager.collectives.telemetry is None and _train(manager, model, opt, 1) == [True]
    finally:
        manager.close()


def test_without_a_ring_nothing_is_recorded(controller, monkeypatch):  # noqa: F811
    monkeypatch.delenv(ENV_TELEMETRY_FILE, raising=False)
    _trains_one_step_without_telemetry(controller)


def test_a_ring_that_cannot_be_made_is_logged_and_training_goes_on(controller, tmp_path, monkeypatch, caplog):  # noqa: F811
    monkeypatch.setenv(ENV_TELEMETRY_FILE, str(tmp_path / "no-such-dir" / "slot-0.ring"))
    _trains_one_step_without_telemetry(controller)
    assert "no collective telemetry: cannot create the ring" in caplog.text
