"""Catch-up over several connections (lanes) and into the rank's own optimizer tensors: the lane
split against a naive reference, bitwise copies over real loopback HTTP, damage on one lane,
acks only after every lane, optimizer state received in place."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from fthsdp.errors import TransferError
from fthsdp.state.digest import state_digest
from fthsdp.state.fetch import FETCH_LANES, LANE_MIN_BYTES, _receive_lanes, fetch_once, fetch_state, lanes_for
from fthsdp.state.serve import _Delivered
from fthsdp.state.stream import PART_BYTES, PIECE_BYTES, StateTarget, fresh_cpu_tensor, lane_bytes, lane_parts
from tests.runtime.faults import DamagingProxy
from tests.runtime.state_source import KEY, live_snapshot, serving


@pytest.mark.parametrize("seed", range(20))
def test_the_lanes_carry_every_byte_once_in_order_like_a_naive_split(seed):
    rng = random.Random(seed)
    choices = [0, 1, 1000, PART_BYTES + 3, PIECE_BYTES, 2 * PIECE_BYTES + 5]
    sizes = [rng.choice(choices) for _ in range(rng.randint(1, 6))]
    if not sum(sizes):
        sizes.append(7)
    lanes = rng.randint(1, 5)
    data = bytearray(rng.getrandbits(8) for _ in range(sum(sizes))) if sum(sizes) < 5000 else bytearray(sum(sizes))
    views, off = [], 0
    for n in sizes:
        views.append(memoryview(data)[off:off + n])
        off += n
    # naive: cut every tensor into pieces; a piece goes to the lane whose equal share of all the
    # bytes its first byte falls in; each piece's parts are PART_BYTES long, the last one shorter
    pieces: list[list[tuple[int, int]]] = [[] for _ in range(lanes)]
    start = 0
    for n in sizes:
        for lo in range(0, n, PIECE_BYTES):
            lane = min(lanes - 1, (start + lo) * lanes // sum(sizes))
            pieces[lane].append((start + lo, start + min(n, lo + PIECE_BYTES)))
        start += n
    for lane in range(lanes):
        got = [(bool(end), bytes(part)) for end, part in lane_parts(views, lane, lanes)]
        want = [(hi - a <= PART_BYTES, bytes(data[a:min(hi, a + PART_BYTES)]))
                for lo, hi in pieces[lane] for a in range(lo, hi, PART_BYTES)]
        assert got == want
        assert lane_bytes(sizes, lane, lanes) == sum(hi - lo for lo, hi in pieces[lane])


@pytest.mark.parametrize("expected_bytes, cpus, lanes", [
    (0, 64, 1), (LANE_MIN_BYTES - 1, 64, 1), (2 * LANE_MIN_BYTES, 64, 2), (100 * LANE_MIN_BYTES, 64, FETCH_LANES),
    (100 * LANE_MIN_BYTES, 2, 1), (100 * LANE_MIN_BYTES, 8, 2),
])
def test_a_fetch_opens_a_lane_per_16_mib_and_per_4_cpus(expected_bytes, cpus, lanes):
    assert lanes_for(expected_bytes, cpus) == lanes


def test_a_fetcher_counts_as_sent_only_once_every_lane_of_one_transfer_was_sent():
    sent = _Delivered()
    sent.record("b", 0, 2)
    assert "b" not in sent
    sent.record("b", 1, 2)
    assert "b" in sent
    sent.record("c", 1, 3)
    sent.record("c", 0, 2)  # another transfer, with another lane count: counted again from there
    sent.record("c", 2, 3)
    assert "c" not in sent


def _model(seed: int, trained: bool):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    if trained:
        model(torch.randn(4, 1024)).sum().backward()
        opt.step()
    return model, opt


@pytest.fixture
def source():
    model, opt = _model(0, trained=True)
    server = serving(live_snapshot(model, opt, 5, '{"positions": {"a": 3}}'), 5)
    yield model, opt, server
    server.close()


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_a_fetch_over_several_lanes_is_the_source_bitwise_and_its_ack_counts(source, lanes):
    model, opt, server = source
    dst_model, dst_opt = _model(99, trained=False)
    fetched = fetch_once(server.address, 5, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, key=KEY, lanes=lanes)
    dst_opt.load_state_dict(fetched.optimizer_state)
    assert state_digest(dst_model, dst_opt, "", 5, {}) == state_digest(model, opt, "", 5, {})
    assert server.fetches_accepted == lanes
    assert server.stop(("b",), 0.0) == {"b"}  # no ack yet
    server.serve(5, ("b",))
    fetch_state(server.address, 5, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, 1, key=KEY)  # then acks
    assert server.stop(("b",), 5.0) == set()


def test_damage_on_one_lane_fails_the_whole_fetch_and_the_next_is_clean(source):
    model, opt, server = source
    proxy = DamagingProxy(server.address, "corrupt", after_bytes=1 << 20)
    try:
        dst_model, dst_opt = _model(99, trained=False)
        with pytest.raises(TransferError, match="checksum"):
            fetch_once(proxy.address, 5, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, key=KEY, lanes=2)
        fetched = fetch_once(proxy.address, 5, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, key=KEY, lanes=2)
        dst_opt.load_state_dict(fetched.optimizer_state)
        assert state_digest(dst_model, dst_opt, "", 5, {}) == state_digest(model, opt, "", 5, {})
    finally:
        proxy.close()


def test_a_rank_that_trained_before_receives_the_optimizer_state_into_its_own_tensors(source):
    model, opt, server = source
    dst_model, dst_opt = _model(99, trained=True)
    live = {(i, k): v.data_ptr() for i, p in enumerate(dst_opt.param_groups[0]["params"])
            for k, v in dst_opt.state[p].items()}
    fetched = fetch_once(server.address, 5, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, key=KEY)
    received = {(i, k): v.data_ptr() for i, per in fetched.optimizer_state["state"].items() for k, v in per.items()
                if isinstance(v, torch.Tensor)}
    assert received == live  # written in place: no fresh memory, nothing copied at adoption
    params = dst_opt.param_groups[0]["params"]
    assert all(v is dst_opt.state[params[i]][k] for i, per in fetched.optimizer_state["state"].items()
               for k, v in per.items() if isinstance(v, torch.Tensor))  # the very values it holds
    dst_opt.load_state_dict(fetched.optimizer_state)
    assert {(i, k): v.data_ptr() for i, p in enumerate(dst_opt.param_groups[0]["params"])
            for k, v in dst_opt.state[p].items()} == live
    assert state_digest(dst_model, dst_opt, "", 5, {}) == state_digest(model, opt, "", 5, {})


def test_fresh_memory_for_a_fetch_is_an_ordinary_writable_tensor():
    t = fresh_cpu_tensor((3, 1 << 20), torch.float32)  # 12 MiB: asked for in huge pages
    t.fill_(2.0)
    assert t.shape == (3, 1 << 20) and t.is_contiguous() and float(t.sum()) == 6.0 * (1 << 20)
    assert fresh_cpu_tensor((5,), torch.bfloat16).shape == (5,)


class _Lane:
    """A stand-in lane for `_receive_lanes` (the real ones need a source): its receive fails
    with `error`, or blocks until another lane's failure aborts it."""

    def __init__(self, lane: int, error: BaseException | None = None) -> None:
        self.lane, self.address, self.error, self._aborted = lane, "127.0.0.1:1", error, threading.Event()

    def receive(self, views, stop) -> None:
        if self.error is not None:
            raise self.error
        assert self._aborted.wait(10.0), "never aborted"
        raise TransferError("aborted")

    def abort(self) -> None:
        self._aborted.set()


def test_any_failure_of_a_helper_lane_fails_the_fetch_and_stops_the_others():
    """Not only a TransferError: a lane that fails otherwise (a bug, a MemoryError) must not
    leave its share of the bytes unwritten while the fetch counts as done."""
    with pytest.raises(TransferError, match="fetch lane 1 from 127.0.0.1:1 failed: ValueError"):
        _receive_lanes([_Lane(0), _Lane(1, ValueError("boom"))], [], lambda: False, 10.0)
