"""Attacks on a rank's state server: it runs in its own process (tests/security/port_server.py),
serving 16 MiB of state to its one assigned fetcher "b"; strangers send raw HTTP on loopback.
Strangers get no state and release no hold, only "b" may fetch and acknowledge, readers that stop
reading cannot hold the source past its bound, and connections and threads stay capped."""

from __future__ import annotations

import http.client
import itertools
import socket
import time

import pytest
import torch

from ftar_kernels import auth
from fthsdp.state import request_auth
from fthsdp.state.fetch import fetch_state
from fthsdp.state.serve import MAX_CONNECTIONS
from fthsdp.state.stream import StateTarget
from protos import job_secret
from tests.security.trainer_ports import STRANGER, PortProcess, closed_by_peer, dial
from tests.trainer_secret import SECRET
from tests.waiting import wait_for

KEY = SECRET.key(job_secret.PURPOSE_STATE)
STATE_BYTES, HELLO_TIMEOUT_S = 16 << 20, 3.0
_steps = itertools.count(10)


@pytest.fixture(scope="module")
def process(tmp_path_factory):
    server = PortProcess("state", tmp_path_factory.mktemp("state") / "state.log", state_bytes=STATE_BYTES,
                         hello_timeout_s=HELLO_TIMEOUT_S)
    yield server
    server.close()


@pytest.fixture
def source(process):
    """The source, serving a step of its own for this test."""
    process.step = process.ask(f"serve {next(_steps)}")["step"]
    return process


def request(source: PortProcess, method: str, path: str, key: bytes | None = KEY, at: float | None = None,
            header: str | None = None) -> tuple[int, bytes]:
    """One request signed with `key` (None: unsigned); status and at most 64 KiB of the body."""
    conn = http.client.HTTPConnection(*source.host_port, timeout=20)
    try:
        if header is None and key is not None:
            header = request_auth.sign(key, method, path, time.time() if at is None else at, auth.nonce())
        conn.request(method, path, headers={request_auth.HEADER: header} if header else {})
        resp = conn.getresponse()
        return resp.status, resp.read(64 << 10)
    finally:
        conn.close()


def fetch(source: PortProcess) -> torch.Tensor:
    """The real fetcher "b": the whole state, verified, then acknowledged."""
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.zeros(STATE_BYTES // 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fetch_state(source.address, source.step, "b", lambda: StateTarget(model, opt), 20.0, 1, key=KEY)
    return model.weight.detach()


def expected_state() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(STATE_BYTES // 4)


def test_strangers_get_no_state_and_release_no_hold_and_the_real_fetch_proceeds(source):
    step, refused = source.step, source.ask("stats")["refused"]
    source.send("stop 30")  # the source holds for "b" (at most 30 s) before its state changes
    state, ack = f"/state?step={step}&replica=b", f"/ack?step={step}&replica=b"
    stranger = STRANGER.key(job_secret.PURPOSE_STATE)
    for method, path, key, why in (("GET", state, None, "no X-Fthsdp-Auth header"),
                                   ("GET", state, stranger, "not authenticated"),
                                   ("POST", ack, None, "no X-Fthsdp-Auth header"),
                                   ("POST", ack, stranger, "not authenticated")):
        status, body = request(source, method, path, key)
        assert (status, why in body.decode()) == (401, True), (method, path, status, body[:300])
    # A member of the job is held to the plan: only "b" fetches, and its ack counts only after
    # it was sent the whole state.
    assert request(source, "POST", ack)[0] == 409
    status, body = request(source, "POST", f"/ack?step={step}&replica=c")
    assert status == 403 and b"replica c is not a fetcher" in body
    assert request(source, "GET", f"/state?step={step}&replica=c")[0] == 403
    assert torch.equal(fetch(source), expected_state())  # still served: no ack released the hold
    assert source.reply(30.0, "stop") == {"missing": []}
    stats = source.ask("stats")
    assert stats["refused"] == refused + 4 and stats["acks"] == ["b"]


async def test_three_readers_that_stop_reading_cannot_hold_the_source_past_its_bound(source):
    threads, rss = source.threads(), source.rss_mib()
    path = f"/state?step={source.step}&replica=b"
    readers = []
    for _ in range(3):  # authenticated, as a stuck fetcher would be: they read the headers, then stop
        s = dial(source.host_port)
        header = request_auth.sign(KEY, "GET", path, time.time(), auth.nonce())
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{request_auth.HEADER}: {header}\r\n\r\n".encode())
        assert s.recv(12) == b"HTTP/1.1 200"
        readers.append(s)
    try:
        assert source.ask("stop 1.0", timeout_s=30.0) == {"missing": ["b"]}  # bounded: 1 s + 2 cut-off graces
        for s in readers:  # their transfers were cut: what they got ends short of the state
            got = 0
            try:
                while chunk := s.recv(1 << 20):
                    got += len(chunk)
            except ConnectionResetError:
                pass
            assert got < STATE_BYTES
    finally:
        for s in readers:
            s.close()
    await wait_for(lambda: source.ask("stats")["connections"] == 0 and source.threads() <= threads, 10.0,
                   f"no connection left and at most {threads} threads")
    assert source.rss_mib() < rss + 64


async def test_connections_are_capped_and_unauthenticated_ones_closed_at_their_deadline(source):
    threads, before = source.threads(), source.ask("stats")
    silent = [dial(source.host_port) for _ in range(3 * MAX_CONNECTIONS)]
    try:
        def counted():
            s = source.ask("stats")
            return s["admitted"] + s["turned_away"] - before["admitted"] - before["turned_away"] == len(silent) and s
        stats = await wait_for(counted, 20.0, "every connection admitted or turned away")
        assert stats["turned_away"] - before["turned_away"] >= len(silent) - MAX_CONNECTIONS
        assert stats["connections"] <= MAX_CONNECTIONS and source.threads() <= threads + MAX_CONNECTIONS
        assert all(closed_by_peer(s) for s in silent)  # turned away at once, or shut at their deadline
    finally:
        for s in silent:
            s.close()
    # the server notices the closes on its own time: wait (bounded) for it to let them go
    await wait_for(lambda: source.ask("stats")["connections"] == 0 and source.threads() <= threads, 10.0,
                   f"no connection left and at most {threads} threads")
    assert torch.equal(fetch(source), expected_state())


def test_replayed_late_or_altered_requests_are_refused(source):
    path = f"/ack?step={source.step}&replica=c"
    header = request_auth.sign(KEY, "POST", path, time.time(), auth.nonce())
    assert request(source, "POST", path, header=header)[0] == 403  # authentic (c is just not a fetcher)
    status, body = request(source, "POST", path, header=header)  # the same request again
    assert status == 401 and b"replayed" in body
    status, body = request(source, "POST", path.replace("replica=c", "replica=b"),
                           header=request_auth.sign(KEY, "POST", path, time.time(), auth.nonce()))
    assert status == 401 and b"not authenticated" in body  # the tag covers the query
    status, body = request(source, "POST", path, at=time.time() - 3600)
    assert status == 401 and b"away from this host's clock" in body
    status, body = request(source, "GET", f"/state?step={source.step}&replica=b", header="v1 " + "9" * 300)
    assert status == 401 and len(body) < 300  # a huge header is refused, not echoed
    assert torch.equal(fetch(source), expected_state())


def test_a_stranger_speaking_no_http_is_cut_off(source):
    with dial(source.host_port) as s:
        s.sendall(b"\x16\x03\x01" + b"\0" * 4096)  # a TLS hello, say
        assert closed_by_peer(s)
    with socket.create_connection(source.host_port, timeout=20) as s:
        s.sendall(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n")  # a request line past the stdlib's bound
        assert closed_by_peer(s)
    assert torch.equal(fetch(source), expected_state())
