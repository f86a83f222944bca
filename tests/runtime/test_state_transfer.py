"""Catch-up transfers over real loopback HTTP: bitwise copies of the whole training state,
damage detected (through a damaging proxy), holds bounded, strangers' requests bounded."""

from __future__ import annotations

import http.client
import re
import threading
import time

import pytest
import torch

from ftar_kernels import auth
from fthsdp.errors import TransferError
from fthsdp.state.digest import state_digest
from fthsdp.state.fetch import fetch_state
from fthsdp.state.registry import MAX_PAYLOAD_BYTES, StateRegistry
from fthsdp.state import request_auth, serve
from fthsdp.state.stream import STREAM_FORMAT, StateTarget, StreamTag
from tests.runtime.faults import DamagingProxy
from tests.runtime.state_source import KEY, live_snapshot, serving


def _trained(seed: int, steps: int = 2):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    registry = StateRegistry()
    registry.register("sched", sched)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        sched.step()
    return model, opt, registry


@pytest.fixture
def source():
    model, opt, registry = _trained(0)
    server = serving(live_snapshot(model, opt, 5, '{"positions": {"a": 3}}', registry), 5)
    yield model, opt, registry, server
    server.close()


def _fetch(address: str, step: int = 5, attempts: int = 1):
    model, opt, registry = _trained(99, steps=0)
    fetched = fetch_state(address, step, "b", lambda: StateTarget(model, opt, registry.names, MAX_PAYLOAD_BYTES),
                          5.0, attempts, key=KEY)
    opt.load_state_dict(fetched.optimizer_state)
    registry.load_state_dicts(registry.decode(fetched.user_payloads), "the source")
    return model, opt, registry, fetched


def test_fetch_copies_model_optimizer_schedule_and_ledger_bitwise(source):
    model, opt, registry, server = source
    dst_model, dst_opt, dst_registry, fetched = _fetch(server.address)
    assert fetched.manifest.ledger_json == '{"positions": {"a": 3}}'
    assert dst_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.0025  # the schedule's lr travelled
    assert dst_registry.state_dicts()["sched"]["last_epoch"] == 2
    assert state_digest(dst_model, dst_opt, "", 5, dst_registry.state_dicts()) == \
        state_digest(model, opt, "", 5, registry.state_dicts())


@pytest.mark.parametrize("damage, match", [("corrupt", "checksum"), ("truncate", "ended after|failed")])
def test_damage_is_detected_and_fetched_again(source, damage, match):
    model, opt, registry, server = source
    proxy = DamagingProxy(server.address, damage)
    try:
        with pytest.raises(TransferError, match=match):
            _fetch(proxy.address, attempts=1)
        dst_model, dst_opt, dst_registry, _ = _fetch(proxy.address, attempts=1)  # the next transfer is clean
        assert state_digest(dst_model, dst_opt, "", 5, dst_registry.state_dicts()) == \
            state_digest(model, opt, "", 5, registry.state_dicts())
    finally:
        proxy.close()


def test_a_source_of_another_stream_format_is_refused_naming_this_fetchers_format(source, monkeypatch):
    class OtherFormat(StreamTag):  # a source whose tags start from another label, as another version's would
        def __init__(self, key, nonce):
            super().__init__(key, b"another format\0" + nonce)

    model, opt, registry, server = source
    monkeypatch.setattr(serve, "StreamTag", OtherFormat)
    with pytest.raises(TransferError, match=re.escape(f"another stream format than this fetcher's {STREAM_FORMAT!r}")):
        _fetch(server.address, attempts=1)
    monkeypatch.undo()
    dst_model, dst_opt, dst_registry, _ = _fetch(server.address, attempts=1)  # the same source, its format again
    assert state_digest(dst_model, dst_opt, "", 5, dst_registry.state_dicts()) == \
        state_digest(model, opt, "", 5, registry.state_dicts())


def test_retries_within_one_fetch_get_past_a_damaged_transfer(source):
    _, _, _, server = source
    proxy = DamagingProxy(server.address, "corrupt")
    try:
        _fetch(proxy.address, attempts=2)
        assert server.fetches_accepted == 2
    finally:
        proxy.close()


def test_wrong_step_is_refused(source):
    _, _, _, server = source
    with pytest.raises(TransferError, match="refused step 6"):
        _fetch(server.address, step=6)


def test_a_fetcher_whose_registry_differs_is_refused(source):
    _, _, _, server = source
    model, opt, _ = _trained(99, steps=0)
    with pytest.raises(TransferError, match=r"the source sent registered state \[.sched.\]; this rank registered \[\]"):
        fetch_state(server.address, 5, "b", lambda: StateTarget(model, opt, frozenset(), MAX_PAYLOAD_BYTES), 5.0, 1,
                    key=KEY)


def test_stop_waits_for_the_expected_fetcher_then_refuses(source):
    _, _, _, server = source
    missing: list[set[str]] = []
    holder = threading.Thread(target=lambda: missing.append(server.stop(("b",), 10.0)))
    holder.start()
    _fetch(server.address)
    holder.join(10.0)
    assert missing == [set()]
    with pytest.raises(TransferError, match="refused"):
        _fetch(server.address)


def test_stop_gives_up_on_a_fetcher_that_never_comes(source):
    _, _, _, server = source
    assert server.stop(("ghost",), 0.05) == {"ghost"}


def test_acknowledgements_that_do_not_fit_are_refused(source):
    _, _, _, server = source
    host, _, port = server.address.rpartition(":")
    statuses = []
    for url in ("/ack?step=4&replica=b", f"/ack?step=5&replica={'x' * 200}", "/ack?step=5", "/nope",
                "/ack?step=5&replica=c", "/ack?step=5&replica=b"):  # c is no fetcher; b fetched nothing yet
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request("POST", url, headers={request_auth.HEADER: request_auth.sign(KEY, "POST", url, time.time(),
                                                                                  auth.nonce())})
        statuses.append(conn.getresponse().status)
        conn.close()
    assert statuses == [409, 400, 400, 400, 403, 409]
    assert server._acks == {}
