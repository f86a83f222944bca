"""Small tensors travel in runs: the run split against the parts it groups, the multi-buffer
socket reads and writes over a real socket pair (partial transfers, bytes that came with the
head, short streams), and fetches of states of many small tensors over real loopback HTTP:
bitwise, damage inside a run of small tensors caught by the stream tag, and no Nagle at the source."""

from __future__ import annotations

import http.client
import io
import random
import socket
import threading

import numpy as np

import pytest
import torch

from ftar_kernels import auth
from fthsdp.errors import TransferError
from fthsdp.state import wire
from fthsdp.state.digest import state_digest
from fthsdp.state.fetch import _signed, fetch_once
from fthsdp.state.stream import (MAX_RUN_PARTS, PART_BYTES, PIECE_BYTES, SMALL_PART_BYTES, StateTarget,
                                 lane_parts, lane_runs, tensor_bytes)
from tests.runtime.faults import DamagingProxy
from tests.runtime.state_source import KEY, live_snapshot, serving


def _where(part: memoryview) -> int:
    return np.frombuffer(part, np.uint8).ctypes.data


def _views(sizes: list[int]) -> list[memoryview]:
    data = memoryview(bytearray(sum(sizes)))
    out, off = [], 0
    for n in sizes:
        out.append(data[off:off + n])
        off += n
    return out


@pytest.mark.parametrize("seed", range(20))
def test_runs_group_the_parts_in_order_small_ones_together_within_a_part(seed):
    rng = random.Random(seed)
    choices = [0, 4, 1024, 3000, SMALL_PART_BYTES - 1, SMALL_PART_BYTES, PART_BYTES + 3, PIECE_BYTES + 5]
    sizes = [rng.choice(choices) for _ in range(rng.randint(1, 400))] + [7]
    views, lanes = _views(sizes), rng.randint(1, 3)
    for lane in range(lanes):
        runs = list(lane_runs(views, lane, lanes))
        flat = [(end, part) for run in runs for end, part in run]
        want = [(e, _where(p), len(p)) for e, p in lane_parts(views, lane, lanes)]
        assert [(e, _where(p), len(p)) for e, p in flat] == want
        for run in runs:
            lengths = [len(p) for _, p in run]
            assert len(run) == 1 or (all(n < SMALL_PART_BYTES for n in lengths)
                                     and sum(lengths) <= PART_BYTES and len(run) <= MAX_RUN_PARTS)


def test_two_thousand_small_tensors_between_large_ones_take_a_few_runs_not_one_each():
    sizes = [1024 if i % 21 else 2 * PART_BYTES for i in range(2100)]  # a deep model's shard: 2 parts a large one
    runs = list(lane_runs(_views(sizes)))
    parts = sum(1 for _ in lane_parts(_views(sizes)))
    assert parts == 2000 + 100 * 2 and len(runs) == 100 * 2 + 100  # the 20 small ones after each large one: one run
    sizes = [4] * 1000
    assert [len(r) for r in lane_runs(_views(sizes))] == [MAX_RUN_PARTS] * 3 + [1000 - 3 * MAX_RUN_PARTS]


def test_tensor_bytes_are_the_tensors_own_writable_memory_for_every_dtype_and_shape():
    for t in [torch.zeros(()), torch.zeros(3, 4), torch.zeros((), dtype=torch.bfloat16), torch.zeros(5, dtype=torch.bfloat16),
              torch.zeros(0), torch.zeros(2, 0), torch.nn.Parameter(torch.zeros(3)), torch.zeros(3, dtype=torch.bool)]:
        view = tensor_bytes(t)
        assert (view.format, view.ndim, view.nbytes) == ("B", 1, t.numel() * t.element_size())
        if view.nbytes:
            view[:] = b"\x01" * view.nbytes
            assert t.detach().reshape(-1).view(torch.uint8).eq(1).all()
    with pytest.raises(ValueError, match="contiguous=False"):
        tensor_bytes(torch.zeros(4, 4).t())


class _Pair:
    """A connected pair of real sockets, the reading end bounded like a state stream's."""

    def __init__(self) -> None:
        self.a, self.b = socket.socketpair()
        wire.use_kernel_timeouts(self.b, 5.0)

    def close(self) -> None:
        self.a.close()
        self.b.close()


@pytest.fixture
def pair():
    p = _Pair()
    yield p
    p.close()


def _response(sock: socket.socket, body: int, early: bytes = b"") -> wire.Response:
    headers = http.client.parse_headers(io.BytesIO(f"Content-Length: {body}\r\n\r\n".encode()))
    return wire.Response(sock, 200, headers, early, 5.0, PART_BYTES)


@pytest.mark.parametrize("seed", range(8))
def test_read_into_fills_every_buffer_from_the_early_bytes_then_odd_sized_arrivals(pair, seed):
    rng = random.Random(seed)
    sizes = [rng.choice([0, 1, 3, 1024, 70000]) for _ in range(rng.randint(1, 700))]
    data = bytes(rng.getrandbits(8) for _ in range(sum(sizes)))
    early = rng.randint(0, len(data))
    resp = _response(pair.b, len(data) + 5, data[:early])

    def send() -> None:
        rest = memoryview(data)[early:]
        while rest:
            k = rng.randint(1, 9000)
            pair.a.sendall(rest[:k])
            rest = rest[k:]

    sender = threading.Thread(target=send, daemon=True)  # a failed read must not leave it blocking the run
    sender.start()
    views = _views(sizes)
    resp.read_into(views)
    sender.join(10.0)
    assert b"".join(v.tobytes() for v in views) == data and resp.left == 5


def test_read_into_refuses_more_than_the_body_before_reading_and_names_a_short_stream(pair):
    resp = _response(pair.b, 10)
    with pytest.raises(TransferError, match="10 bytes short of a 11-byte section"):
        resp.read_into(_views([5, 6]))
    assert resp.left == 10
    pair.a.sendall(b"abcdefg")
    pair.a.shutdown(socket.SHUT_WR)
    views = _views([4, 4, 2])
    with pytest.raises(TransferError, match="ended after 7 of 10 bytes"):
        resp.read_into(views)
    assert resp.left == 3 and views[0].tobytes() == b"abcd" and views[1].tobytes()[:3] == b"efg"


def test_send_all_moves_many_buffers_through_a_full_socket_in_order(pair):
    pair.a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # every sendmsg only partly taken
    rng = random.Random(3)
    chunks = [bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 100, 5000]))) for _ in range(wire.MAX_IOV + 300)]
    want = b"".join(chunks)
    got = bytearray()

    def receive() -> None:
        while len(got) < len(want):
            data = pair.b.recv(1000)
            if not data:
                return
            got.extend(data)

    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    wire.send_all(pair.a, [memoryview(c) for c in chunks])
    reader.join(10.0)
    assert bytes(got) == want


def _small_model(seed: int, trained: bool):
    """Several hundred small tensors of many shapes and dtypes between a few large ones."""
    torch.manual_seed(seed)
    model = torch.nn.Module()
    shapes = [(), (1,), (3,), (256,), (17, 9), (1000,), (SMALL_PART_BYTES // 4 + 3,)]
    model.p = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(shapes[i % 7] if i % 100 else (PART_BYTES // 2,)))
                                      for i in range(300)])
    model.h = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(5, dtype=torch.bfloat16)) for _ in range(20)])
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    if trained:
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    return model, opt


@pytest.fixture
def small_source():
    model, opt = _small_model(0, trained=True)
    snapshot = live_snapshot(model, opt, 4)
    server = serving(snapshot, 4)
    yield model, opt, server, snapshot
    server.close()


@pytest.mark.parametrize("trained", [False, True])
def test_a_state_of_many_small_tensors_arrives_bitwise(small_source, trained):
    model, opt, server, _ = small_source
    dst_model, dst_opt = _small_model(9, trained=trained)
    fetched = fetch_once(server.address, 4, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, key=KEY)
    dst_opt.load_state_dict(fetched.optimizer_state)
    assert len(fetched.manifest.entries) > 1000
    assert state_digest(dst_model, dst_opt, "", 4, {}) == state_digest(model, opt, "", 4, {})


@pytest.mark.parametrize("damage", ["corrupt", "truncate"])
def test_damage_inside_a_run_of_small_tensors_fails_the_fetch_and_the_next_is_clean(small_source, damage):
    model, opt, server, snapshot = small_source
    manifest, tensors = snapshot()
    head = len(manifest.to_bytes()) + 32 + 1024  # the HTTP head is shorter than 1 KiB
    offset = 0  # of the 10th part of the first long run of small tensors, in the tensor bytes
    for run in lane_runs([tensor_bytes(t) for t in tensors]):
        if len(run) > 20:
            offset += sum(len(part) for _, part in run[:10])
            break
        offset += sum(len(part) for _, part in run)
    proxy = DamagingProxy(server.address, damage, after_bytes=head + offset)
    try:
        dst_model, dst_opt = _small_model(9, trained=True)
        with pytest.raises(TransferError, match="state stream"):
            fetch_once(proxy.address, 4, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, key=KEY)
        fetched = fetch_once(proxy.address, 4, "b", lambda: StateTarget(dst_model, dst_opt), 5.0, key=KEY)
        dst_opt.load_state_dict(fetched.optimizer_state)
        assert state_digest(dst_model, dst_opt, "", 4, {}) == state_digest(model, opt, "", 4, {})
    finally:
        proxy.close()


def test_the_source_streams_without_nagle_so_a_run_of_small_tensors_never_waits_for_an_ack(small_source):
    """With Nagle's algorithm a run of small tensors sent after data the fetcher had not yet
    acknowledged waited for the fetcher's delayed ACK while the fetcher waited for the run."""
    _, _, server, _ = small_source
    path = "/state?step=4&replica=b"
    sock = wire.send_get(server.address, path, _signed(KEY, "GET", path, auth.nonce()), 5.0)
    try:
        assert wire.read_response(sock, server.address, 5.0, PART_BYTES).status == 200  # the stream has begun; we read no more
        [stream] = server._httpd._streams  # its 17 MB do not fit the socket buffers: still sending
        assert stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()
