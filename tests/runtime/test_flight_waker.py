"""streaming_diloco's flight waker in one replica (a Manager in this process against a real
controller whose quorums close on their join timeout): a failure it reads while the trainer
computes raises at the trainer's next call as the blocking path raises it, so does an error that
ends the waker, and close() and
abort() with a sync in flight leave no waker thread behind; without an overlap there is none."""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from fthsdp import FaultTolerantOptimizer, Manager, RuntimeSettings
from fthsdp.errors import Fatal
from fthsdp.step.protocol import ProtocolError
from tests.runtime.test_semisync_in_process import LR, batch_at, build, controllers  # noqa: F401 - a fixture
from tests.trainer_secret import SECRET
from tests.waiting import wait_until

H, F, TAU = 4, 2, 1
K = H // F


def wakers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fthsdp-flight-waker")]


def start(ctl, tau: int = TAU) -> tuple[Manager, torch.optim.Optimizer, torch.nn.Module]:
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    settings = RuntimeSettings(job_id="t", replica_id="0", controller_address=ctl.grpc, max_steps=8,
                               quorum_timeout_s=20.0, heartbeat_interval_s=0.5, job_secret=SECRET,
                               sync_mode="streaming_diloco", sync_every_steps=H, sync_fragments=F,
                               sync_overlap_steps=tau)
    return Manager(model, opt, settings).start(), opt, model


def to_flight(manager: Manager, opt, model):
    """Inner steps up to the one that sends the sync ahead; returns that step's batch (phase INNER)."""
    ft = FaultTolerantOptimizer(manager, opt)
    for x, y in manager.batches(batch_at):
        if manager.sync_in_flight:
            return ft, x, y
        ft.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        ft.step()
    raise AssertionError("no sync went ahead")


def test_a_coordinator_lost_while_the_trainer_computes_raises_at_its_next_call_as_the_blocking_path_does(
        controllers):
    ctl = controllers("streaming_diloco", H, 0.2, F)  # one replica: each quorum closes on the timeout
    manager, opt, model = start(ctl)
    try:
        ft, x, y = to_flight(manager, opt, model)
        assert manager.phase.name == "INNER" and len(wakers()) == 1
        manager.client._sock.shutdown(socket.SHUT_RDWR)  # the channel to the coordinator ends
        wait_until(lambda: manager._held, 30.0, "the waker to read the lost channel")  # and hand it over
        assert manager.phase.name == "INNER" and manager.sync_in_flight  # nothing applied on the waker
        ft.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with pytest.raises(Fatal, match=r"rank 0 lost its coordinator \(rank 0\): .*closed the connection; exit so"):
            ft.step()  # the trainer's next call
        assert manager.phase.name == "FAILED"
    finally:
        manager.abort()
    assert not wakers()


def test_an_effect_the_waker_may_not_run_ends_it_and_raises_at_the_trainers_next_call(controllers, monkeypatch):
    """Were the table to ask the waker for an effect outside WAKER_EFFECTS (here the vote, taken
    out of them), the waker raises, ends, and the trainer's next Manager call raises its error."""
    from fthsdp.step import events as ev, feeding
    monkeypatch.setattr(feeding, "WAKER_EFFECTS", (ev.ConfigureRing, ev.StartReduce))
    ctl = controllers("streaming_diloco", H, 0.2, F)
    manager, opt, model = start(ctl)
    try:
        ft, _, _ = to_flight(manager, opt, model)
        wait_until(lambda: not wakers(), 30.0, "the waker to end on the vote it may not send")
        with pytest.raises(ProtocolError, match=r"the flight waker may only move a sync in flight on, but Reduced "
                                                r"in flight REDUCING asks for SendVote: a bug in the step protocol"):
            ft.zero_grad()
    finally:
        manager.abort()


@pytest.mark.parametrize("how", ["close", "abort"])
def test_close_and_abort_with_a_sync_in_flight_join_the_waker(controllers, how):
    ctl = controllers("streaming_diloco", H, 0.2, F)
    manager, opt, model = start(ctl)
    try:
        to_flight(manager, opt, model)
        assert len(wakers()) == 1 and manager.sync_in_flight
    finally:
        getattr(manager, how)()
    assert not wakers()


def test_without_an_overlap_there_is_no_waker(controllers):
    ctl = controllers("streaming_diloco", H, 0.2, F)
    manager, _, _ = start(ctl, tau=0)
    try:
        assert manager.settings.overlap_steps == 0 and not wakers()
    finally:
        manager.close()
