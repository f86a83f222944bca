"""A catch-up source that serves an immutable copy of its state keeps training while it is read.

The copy is taken at the step boundary (fthsdp/state/snapshot.py; on a GPU it is the pinned
host copy, here the CPU emulation: `copy_cpu=True`). The source stops serving its live
state without waiting for its fetcher, changes its state (the optimizer step), and begins
the next step; the fetcher still gets the state at the start of the step it asked for,
bitwise; its acknowledgement releases the copy, and so does the hold timeout. The copy is
served under the live state's rules: only to the plan's fetchers, an ack only after the
whole stream.
"""

from __future__ import annotations

import asyncio
import http.client
import time

import pytest
import torch

from ftar_kernels import auth
from fthsdp.errors import TransferError
from fthsdp.state import request_auth, snapshot
from fthsdp.state.digest import state_digest
from fthsdp.state.fetch import fetch_state
from fthsdp.state.registry import MAX_PAYLOAD_BYTES
from fthsdp.state.serve import StateServer
from fthsdp.state.stream import StateTarget
from tests.runtime.test_state_transfer import KEY, _fetch, _trained
from tests.waiting import wait_for_blocking

LEDGER = '{"positions": {"a": 3}}'


def _train_one_step(model, opt) -> None:
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()


@pytest.fixture
def copying_source():
    model, opt, registry = _trained(0)
    held = snapshot.take(5, LEDGER, model, opt, registry, copy_cpu=True)
    server = StateServer("127.0.0.1", 0, held.served, label="copy", key=KEY).start()
    server.serve(5, ("b",))
    yield model, opt, registry, held, server
    server.close()


def test_the_source_trains_on_while_its_fetcher_reads_the_copy(copying_source):
    model, opt, registry, held, server = copying_source
    assert held.copied and held.nbytes > 0
    before = state_digest(model, opt, "", 5, registry.state_dicts())
    missing = server.stop(("b",), 30.0, keep=held.served())  # returns at once: nobody holds
    assert missing == {"b"}
    _train_one_step(model, opt)  # the optimizer step of step 5 ...
    server.serve(6)              # ... and the next step begins
    assert state_digest(model, opt, "", 5, registry.state_dicts()) != before

    dst_model, dst_opt, dst_registry, fetched = _fetch(server.address, step=5)
    assert fetched.manifest.step == 5 and fetched.manifest.ledger_json == LEDGER
    assert state_digest(dst_model, dst_opt, "", 5, dst_registry.state_dicts()) == before
    with pytest.raises(TransferError, match="refused step 5"):  # acknowledged: the copy is gone
        _fetch(server.address, step=5)


def test_in_place_state_is_not_kept_past_stop():
    model, opt, registry = _trained(0)
    held = snapshot.take(5, LEDGER, model, opt, registry)
    assert not held.copied  # the live tensors themselves: the source must hold instead
    assert held.tensors[0].data_ptr() == next(iter(model.state_dict().values())).data_ptr()


def test_a_kept_copy_nobody_fetches_is_released_after_the_hold_timeout(copying_source):
    _, _, _, held, server = copying_source
    server.stop(("ghost",), 0.2, keep=held.served())

    def refused() -> bool:
        try:
            _fetch(server.address, step=5)
        except TransferError:
            return True
        return False

    assert asyncio.run(wait_for_blocking(refused, timeout_s=10.0, what="the kept copy to expire"))


def _ack(server: StateServer, step: int, replica: str) -> int:
    host, _, port = server.address.rpartition(":")
    url = f"/ack?step={step}&replica={replica}"
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", url, headers={request_auth.HEADER: request_auth.sign(KEY, "POST", url, time.time(),
                                                                                  auth.nonce())})
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_kept_copy_goes_to_the_plans_fetchers_only_and_counts_acks_after_the_whole_stream(copying_source):
    model, opt, registry, held, server = copying_source
    server.stop(("b",), 30.0, keep=held.served())
    assert _ack(server, 5, "b") == 409  # b was sent nothing yet: its ack does not release the copy
    assert _ack(server, 5, "c") == 403  # c is no fetcher of step 5
    with pytest.raises(TransferError, match="403"):
        fetch_state(server.address, 5, "c", lambda: StateTarget(model, opt, registry.names, MAX_PAYLOAD_BYTES),
                    5.0, 1, key=KEY)
    _fetch(server.address, step=5)  # b: the whole stream, then its ack releases the copy
    with pytest.raises(TransferError, match="refused step 5"):
        _fetch(server.address, step=5)


def test_a_rank_that_stopped_serving_after_admitting_a_fetch_answers_409_and_serves_the_next():
    """Between the admission of a fetch and its snapshot the rank may stop serving (its state is
    about to change): the fetcher is answered 409 naming why, as any refused fetch is, instead
    of a connection closed without an answer (and a traceback in the trainer's log); the server
    serves the next request."""
    model, opt, registry = _trained(0)
    held = snapshot.take(5, LEDGER, model, opt, registry, copy_cpu=True)
    stopped = [True]

    def snap():
        if stopped[0]:
            raise RuntimeError("this rank is not serving its state now")
        return held.served()

    server = StateServer("127.0.0.1", 0, snap, label="racy", key=KEY).start()
    try:
        server.serve(5, ("b",))
        with pytest.raises(TransferError, match="refused step 5: 409 .*not serving its state now"):
            _fetch(server.address, step=5)
        stopped[0] = False
        _, _, _, fetched = _fetch(server.address, step=5)
        assert fetched.manifest.step == 5
    finally:
        server.close()
