"""Streaming DiLoCo and bf16 on the wire: two Managers in this process (threads) against a real
controller, checked against a streaming outer step computed by hand (blocking and overlapped
fragment syncs), through a replica lost between fragment syncs and rebuilt, and for who moves an
overlapped sync while the trainer computes (the flight waker)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import pytest
import torch

from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings, Seams
from fthsdp.demo.faults import Delegate
from fthsdp.step.rank_state import Flight
from fthsdp.sync.outer import fragments_of
from tests.runtime.test_semisync_in_process import LR, batch_at, controllers, inner  # noqa: F401 - a fixture
from tests.trainer_secret import SECRET
from tests.waiting import wait_until

OUTER_LR, MU, H = 0.7, 0.9, 4


@pytest.fixture
def controller(controllers):
    """A controller of 2 replicas in streaming_diloco with H inner steps and `fragments`."""
    return lambda fragments, join_timeout_s=5.0: controllers("streaming_diloco", H, join_timeout_s, fragments)


def build() -> torch.nn.Module:
    """Four parameters (12, 4, 4, 1 elements), the same start on every replica."""
    model, g = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)), \
        torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def train(ctl, replica: str, steps: int, fragments: int, between: Callable[[Manager], bool] = lambda m: True,
          **overrides) -> dict:
    """One replica's loop, unchanged from sync training. `between(manager)` runs after every inner
    step; False aborts the replica there (it is lost)."""
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    settings = RuntimeSettings(job_id="t", replica_id=replica, controller_address=ctl.grpc, max_steps=steps,
                               quorum_timeout_s=20.0, heartbeat_interval_s=0.5, job_secret=SECRET,
                               sync_mode="streaming_diloco", sync_every_steps=H, sync_fragments=fragments,
                               outer_lr=OUTER_LR, outer_momentum=MU, **overrides)
    manager = Manager(model, opt, settings).start()
    ft = FaultTolerantOptimizer(manager, opt)
    positions, syncs = [], {}
    start = (manager.step, [g.clone() for g in manager.outer.global_tensors()])
    batches = manager.batches(batch_at)
    for x, y in batches:
        positions.append(batches.last_position)
        ft.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        assert ft.step()
        if manager.ledger.position(replica) == positions[-1] + 1:  # this inner step's sync committed
            syncs[manager.step] = (manager.digest(), [g.clone() for g in manager.outer.global_tensors()])
        if not between(manager):
            manager.abort()
            return {"positions": positions, "syncs": syncs, "lost": True, "start": start}
    manager.close()  # the model takes the global copy of every fragment
    return {"positions": positions, "syncs": syncs, "ledger": dict(manager.ledger.positions), "start": start,
            "global": manager.outer.global_tensors(), "wire_bytes": manager.outer.nbytes,
            "model": [p.detach().clone() for p in model.parameters()]}


def reference(steps: int, fragments: int, wire: torch.dtype = torch.float32, tau: int = 0) -> list[list[torch.Tensor]]:
    """Streaming DiLoCo by hand, two replicas: the global parameters after each sync. With an
    overlap of tau inner steps the pseudo-gradient is taken tau steps before the sync is due;
    the replicas train those steps on, and the synced fragment then takes the new global value."""
    g = [p.detach().clone() for p in build().parameters()]
    local = {r: [t.clone() for t in g] for r in ("0", "1")}
    momentum: list[torch.Tensor | None] = [None] * len(g)
    cut, k, after = fragments_of([t.numel() for t in g], fragments), H // fragments, []
    for step in range(steps):
        local = {r: inner(local[r], r, step * k, k - tau, build) for r in local}
        taken = {r: [t.clone() for t in local[r]] for r in local}
        local = {r: inner(local[r], r, step * k + k - tau, tau, build) for r in local}
        for i in cut[(step + 1) % fragments]:
            d0, d1 = (g[i] - taken["0"][i]).to(wire), (g[i] - taken["1"][i]).to(wire)
            delta = (d0 + d1).float() / 2  # FTAR sums in the wire dtype; the division is after
            momentum[i] = delta if momentum[i] is None else MU * momentum[i] + delta
            g[i] = g[i] - OUTER_LR * (delta + MU * momentum[i])  # Nesterov
            local["0"][i], local["1"][i] = g[i].clone(), g[i].clone()
        after.append([t.clone() for t in g])
    return after


def both(ctl, steps: int, fragments: int, **overrides) -> tuple[dict, dict]:
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(train, ctl, r, steps, fragments, **overrides) for r in ("0", "1")]
        return futures[0].result(timeout=120), futures[1].result(timeout=120)


@pytest.mark.parametrize("fragments, wire, tau", [(2, "float32", 1), (4, "float32", 0), (2, "bfloat16", 0)])
def test_streaming_replicas_are_bitwise_equal_after_every_fragment_sync_and_match_a_reference(controller, fragments,
                                                                                            wire, tau):
    """tau = 1: each fragment's sync overlaps an inner step (sync_overlap_steps)."""
    steps, k = 2 * fragments, H // fragments  # every fragment synced twice
    a, b = both(controller(fragments), steps, fragments, sync_wire_dtype=wire, sync_overlap_steps=tau)
    assert sorted(a["syncs"]) == sorted(b["syncs"]) == list(range(1, steps + 1))
    for step, (digest, tensors) in a["syncs"].items():
        assert b["syncs"][step][0] == digest  # the digest covers the global copy and the outer state
        assert all(torch.equal(x, y) for x, y in zip(tensors, b["syncs"][step][1]))
    # exactly once: every inner step's batch, in order, and the ledger moved by k per sync
    assert a["positions"] == b["positions"] == list(range(steps * k))
    assert a["ledger"] == b["ledger"] == {"0": steps * k, "1": steps * k}
    want = reference(steps, fragments, torch.bfloat16 if wire == "bfloat16" else torch.float32, tau)
    for step, (_, tensors) in a["syncs"].items():
        for got, expected in zip(tensors, want[step - 1]):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # after close() the model is the global model, every fragment (what the script saves)
    assert all(torch.equal(m, g) for m, g in zip(a["model"], a["global"]))
    params = sum(t.numel() for t in a["global"])
    assert a["wire_bytes"] == params * (2 if wire == "bfloat16" else 4)  # bf16: half the bytes on the wire


def test_a_replica_lost_between_fragment_syncs_loses_only_its_uncommitted_inner_steps_and_catches_up(controller):
    """Replica 1 dies one inner step after its second sync; replica 0 syncs two fragments alone,
    then a rebuilt replica 1 catches up at a fragment sync and both go on bitwise equal."""
    fragments, steps, k = 2, 7, H // 2
    ctl = controller(fragments, join_timeout_s=2.0)
    lost, rebuilt = threading.Event(), threading.Event()

    def survivor(m: Manager) -> bool:
        if m.step == 4 and m.phase.name == "IDLE" and m.inner == 0:
            assert lost.is_set() and rebuilt.wait(60)  # two syncs without replica 1, then wait for it
        return True

    def first_life(m: Manager) -> bool:
        if m.step == 2 and m.inner == 1:  # one inner step past its second sync: lost
            return False
        return True

    def run_survivor() -> dict:
        def between(m: Manager) -> bool:
            if m.step == 2 and m.inner == 0:
                assert lost.wait(60)
            return survivor(m)
        return train(ctl, "0", steps, fragments, between)

    with ThreadPoolExecutor(2) as pool:
        zero = pool.submit(run_survivor)
        dead = train(ctl, "1", steps, fragments, first_life)
        lost.set()
        assert dead.get("lost") and dead["positions"] == list(range(2 * k + 1))
        watching: list[threading.Thread] = []

        def begun(m: Manager) -> bool:
            """The survivor goes on once the rebuilt replica sent its first sync's begin (so the
            controller's round has it, and waits for the survivor), not merely once it started:
            else the survivor's last syncs could all form before it joins, with no sync in common."""
            if not watching:
                def watch() -> None:
                    try:
                        wait_until(lambda: m.syncs_begun_ahead, 60, "the rebuilt replica's first sync begun")
                    finally:
                        rebuilt.set()  # the survivor waits at most 60 s either way
                watching.append(threading.Thread(target=watch, daemon=True))
                watching[0].start()
            return True
        alive = pool.submit(train, ctl, "1", steps, fragments, begun)
        a, b = zero.result(timeout=120), alive.result(timeout=120)
    assert a["ledger"] == b["ledger"]  # one committed history
    assert a["ledger"]["0"] == steps * k
    # replica 1's inner step past its second sync was never committed: its batch is served again
    caught_up = b["positions"][k:]  # its first k inner steps before the catch-up are discarded
    assert caught_up == list(range(2 * k, a["ledger"]["1"])) and a["ledger"]["1"] < steps * k
    common = sorted(set(a["syncs"]) & set(b["syncs"]))
    assert common and common[-1] == steps, (sorted(a["syncs"]), sorted(b["syncs"]), a["ledger"], b["positions"])
    for step in common:
        assert a["syncs"][step][0] == b["syncs"][step][0]
    assert all(torch.equal(x, y) for x, y in zip(a["global"], b["global"]))


def test_a_streaming_replica_resumes_from_its_checkpoint_at_its_place_in_the_schedule(controller, tmp_path):
    """Killed (aborted) right after its third sync, a replica restarts from the checkpoint of that
    sync: the global copy and outer states are the committed ones, its batches continue where the
    ledger stands, and the next sync carries the fragment the schedule says (fragment_at(3) = 0)."""
    fragments, k = 2, H // 2
    ctl = controller(fragments, join_timeout_s=0.2)  # one replica: each quorum closes on the timeout
    ckpt = {"checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_every_steps": 1}
    first = train(ctl, "0", 5, fragments, lambda m: not (m.step == 3 and m.inner == 0), **ckpt)
    assert first["lost"] and sorted(first["syncs"]) == [1, 2, 3]
    second = train(ctl, "0", 5, fragments, **ckpt)
    step, resumed = second["start"]
    assert step == 3 and all(torch.equal(a, b) for a, b in zip(resumed, first["syncs"][3][1]))
    assert second["positions"] == list(range(3 * k, 5 * k))  # exactly once: from the checkpoint's ledger on
    after = second["syncs"][4][1]
    cut = fragments_of([t.numel() for t in resumed], fragments)
    assert all(not torch.equal(resumed[i], after[i]) for i in cut[0])  # the due fragment moved
    assert all(torch.equal(resumed[i], after[i]) for i in cut[1])  # the other one waits for its turn


def test_the_flight_waker_moves_an_overlapped_sync_while_the_trainer_computes_one_inner_step(controllers):
    """H = 8, F = 2 (K = 4), tau = 2: the sync is prepared after inner step K - tau. Each replica's
    trainer then stays inside that inner step (phase INNER, no Manager call) until its sync is
    decided: the flight waker alone must take the plan, start the FTAR all-reduce, vote and hold
    the commit. Every all-reduce start is recorded through the endpoint with the rank's step,
    inner step, phase and thread; the due step applies the commit on the trainer thread."""
    h, fragments, tau, syncs = 8, 2, 2, 4
    k = h // fragments
    ctl = controllers("streaming_diloco", h, 5.0, fragments)

    def run(replica: str) -> dict:
        starts: list[tuple[int, int, str, str]] = []
        manager: Manager | None = None

        class Recording(Delegate):
            def allreduce(self, tensor):
                starts.append((manager.step, manager.inner, manager.phase.name, threading.current_thread().name))
                return self._inner.allreduce(tensor)

        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        settings = RuntimeSettings(job_id="t", replica_id=replica, controller_address=ctl.grpc, max_steps=syncs,
                                   quorum_timeout_s=20.0, heartbeat_interval_s=0.5, job_secret=SECRET,
                                   sync_mode="streaming_diloco", sync_every_steps=h, sync_fragments=fragments,
                                   sync_overlap_steps=tau)
        manager = Manager(model, opt, settings, seams=Seams(endpoint=Recording)).start()
        ft, digests, held = FaultTolerantOptimizer(manager, opt), {}, []
        for x, y in manager.batches(batch_at):
            step = manager.step
            if manager.sync_in_flight and manager.inner == k - tau:  # the begin went ahead: compute "slowly"
                wait_until(lambda: manager.rank_state.flight is Flight.COMMITTED, 30.0,
                           f"replica {replica}'s sync of step {step} decided while its trainer computes")
                held.append((step, manager.phase.name))
            ft.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            ft.step()
            if manager.step != step:
                digests[manager.step] = manager.digest()
        manager.close()
        return {"starts": starts, "digests": digests, "held": held, "trainer": threading.current_thread().name}

    with ThreadPoolExecutor(2) as pool:
        a, b = [f.result(timeout=120) for f in [pool.submit(run, r) for r in ("0", "1")]]
    assert a["digests"] == b["digests"] and sorted(a["digests"]) == list(range(1, syncs + 1))
    for got in (a, b):
        assert got["held"] == [(s, "INNER") for s in range(syncs)]  # every sync decided inside an inner step
        assert [s for s, _, _, _ in got["starts"]] == list(range(syncs))  # one all-reduce per sync, none retried
        # started by the waker during the inner step the trainer stayed in, never by the trainer
        assert all(inner == k - tau and phase == "INNER" and thread.startswith("fthsdp-flight-waker")
                   for _, inner, phase, thread in got["starts"]), got["starts"]
    assert not [t for t in threading.enumerate() if t.name.startswith("fthsdp-flight-waker")]  # joined at close
