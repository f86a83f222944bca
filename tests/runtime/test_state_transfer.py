"""Catch-up transfers over real loopback HTTP: bitwise copies, damage detected, holds bounded."""

from __future__ import annotations

import threading

import pytest
import torch

from fthsdp.state_fetch import fetch_state
from fthsdp.state_server import StateServer
from fthsdp.state_stream import StateTarget, TransferError, build_manifest, live_entries, state_digest


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    return model, opt


@pytest.fixture
def source():
    model, opt = _trained(0)

    def snapshot():
        entries, scalars = live_entries(model, opt)
        return build_manifest(5, '{"positions": {"a": 3}}', entries, scalars), [t for _, t in entries]

    server = StateServer("127.0.0.1", 0, snapshot, label="test").start()
    server.release(5)
    yield model, opt, server
    server.close()


def _fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(99)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def test_fetch_copies_model_optimizer_and_ledger_bitwise(source):
    model, opt, server = source
    dst_model, dst_opt = _fresh()
    manifest = fetch_state(server.address, 5, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, 1)
    assert manifest.ledger_json == '{"positions": {"a": 3}}'
    assert state_digest(dst_model, dst_opt) == state_digest(model, opt)


@pytest.mark.parametrize("damage", ["corrupt", "truncate"])
def test_damaged_transfer_is_detected_and_fetched_again(source, damage):
    model, opt, server = source
    server.fail_next(damage)
    dst_model, dst_opt = _fresh()
    fetch_state(server.address, 5, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, 2)
    assert server.fetches_accepted == 2
    assert state_digest(dst_model, dst_opt) == state_digest(model, opt)


def test_damage_on_every_attempt_raises_transfer_error(source):
    _, _, server = source
    server.fail_next("corrupt")
    dst_model, dst_opt = _fresh()
    with pytest.raises(TransferError, match="checksum"):
        fetch_state(server.address, 5, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, 1)


def test_wrong_step_is_refused(source):
    _, _, server = source
    dst_model, dst_opt = _fresh()
    with pytest.raises(TransferError, match="refused step 6"):
        fetch_state(server.address, 6, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, 1)


def test_hold_waits_for_the_expected_fetcher_then_stops_serving(source):
    _, _, server = source
    dst_model, dst_opt = _fresh()
    missing: list[set[str]] = []
    holder = threading.Thread(target=lambda: missing.append(server.hold_for_fetchers(5, {"b"}, 10.0)))
    holder.start()
    fetch_state(server.address, 5, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, 1)
    holder.join(10.0)
    assert missing == [set()]
    with pytest.raises(TransferError, match="refused"):
        fetch_state(server.address, 5, "c", lambda: StateTarget(dst_model, dst_opt), 5.0, 1)


def test_hold_gives_up_on_a_fetcher_that_never_comes(source):
    _, _, server = source
    assert server.hold_for_fetchers(5, {"ghost"}, 0.05) == {"ghost"}
