"""Attacks on a rank's state server: it runs in its own process (tests/security/port_server.py),
serving 16 MiB of state to its one assigned fetcher "b"; strangers send raw HTTP on loopback.
Strangers get no state and release no hold, only "b" may fetch and acknowledge, readers that stop
reading cannot hold the source past its bound, connections and threads stay capped, and
strangers' idle connections never keep "b" out. And attacks on the fetcher: a stranger's state
server, or one replaying a real source's recorded answer, is refused before one byte is written."""

from __future__ import annotations

import http.client
import itertools
import socket
import threading
import time

import pytest
import torch

from ftar_kernels import auth
from fthsdp.state import request_auth
from fthsdp.errors import TransferError
from fthsdp.state.fetch import fetch_state
from fthsdp.state.serve import MAX_CONNECTIONS, MAX_UNAUTHENTICATED
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


def fetch(source: PortProcess, address: str | None = None, key: bytes | None = KEY, attempts: int = 1) -> torch.Tensor:
    """The real fetcher "b" (holding the job secret unless `key` None): the whole state of the
    source's step from `address` (the source's unless given), verified, then acknowledged; the
    model it fetched into (zeros before) comes back, also when the fetch raises (as `.model`)."""
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.zeros(STATE_BYTES // 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        fetch_state(address or source.address, source.step, "b", lambda: StateTarget(model, opt), 20.0, attempts,
                    key=key)
    except TransferError as exc:
        exc.model = model.weight.detach()
        raise
    return model.weight.detach()


def expected_state(seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
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
            return s["admitted"] - before["admitted"] == len(silent) and s
        stats = await wait_for(counted, 20.0, "every connection admitted")
        assert stats["turned_away"] - before["turned_away"] >= len(silent) - MAX_UNAUTHENTICATED
        assert stats["connections"] <= MAX_UNAUTHENTICATED
        # a connection pushed out ends its thread on the closed socket
        await wait_for(lambda: source.threads() <= threads + MAX_UNAUTHENTICATED, 10.0,
                       f"at most {threads} + {MAX_UNAUTHENTICATED} threads")
        assert all(closed_by_peer(s) for s in silent)  # pushed out at once, or shut at their deadline
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


async def test_idle_strangers_never_take_the_fetchers_place(tmp_path):
    """300 connections that send nothing, then the real fetch: before, 16 of them held every
    slot for the hello timeout (10 s by default) and the fetch was turned away at once; now
    they only push each other out of their own small budget, and the fetch goes through in
    one attempt while they are still connected."""
    source = PortProcess("state", tmp_path / "state.log", state_bytes=STATE_BYTES, hello_timeout_s=10.0)
    try:
        source.step = 5
        silent = [dial(source.host_port) for _ in range(300)]
        try:
            await wait_for(lambda: source.ask("stats")["admitted"] == len(silent), 20.0, "every connection admitted")
            assert torch.equal(fetch(source), expected_state())
            stats = source.ask("stats")
            assert (stats["accepted"], stats["busy"]) == (1, 0) and stats["unauthenticated"] <= MAX_UNAUTHENTICATED
            # each pushed out by a newer one, or (on a slow machine) shut at its deadline first
            assert stats["turned_away"] + stats["timed_out"] >= len(silent) - MAX_UNAUTHENTICATED
            assert all(closed_by_peer(s) for s in silent)
        finally:
            for s in silent:
                s.close()
        await wait_for(lambda: source.ask("stats")["connections"] == 0, 10.0, "no connection left")
    finally:
        source.close()


@pytest.fixture(scope="module")
def stranger(tmp_path_factory):
    """A stranger's state server: it holds no job secret (it serves without one), and state of its own."""
    server = PortProcess("state", tmp_path_factory.mktemp("stranger") / "state.log", state_bytes=STATE_BYTES,
                         hello_timeout_s=HELLO_TIMEOUT_S, insecure=True, seed=1)
    yield server
    server.close()


def test_state_from_a_source_without_the_job_secret_is_refused_before_anything_is_written(source, stranger):
    stranger.step = stranger.ask(f"serve {source.step}")["step"]  # the step the plan told "b" to fetch
    with pytest.raises(TransferError, match="does not verify under the job secret") as refused:
        fetch(source, stranger.address, attempts=2)
    assert not refused.value.model.any()  # the manifest tag failed first: not one byte was written
    assert stranger.ask("stats")["accepted"] == 2  # it did answer, both attempts
    assert torch.equal(fetch(source), expected_state())  # the real source is unaffected
    # the protection is what refused it: a fetcher without the secret takes the stranger's weights
    assert torch.equal(fetch(stranger, key=None), expected_state(seed=1))


def _replaying(answer: bytes) -> tuple[socket.socket, threading.Thread]:
    """A stranger's server that answers the next request with `answer` (a real source's, recorded)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(20)

    def serve():  # one request: the fetch it is there for
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(20)
            try:
                request = b""
                while b"\r\n\r\n" not in request and (chunk := conn.recv(4096)):
                    request += chunk
                conn.sendall(answer)
            except OSError:
                pass  # the fetcher hung up on it

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_a_recorded_answer_of_the_real_source_does_not_pass_for_a_new_request(source):
    path = f"/state?step={source.step}&replica=b"
    with dial(source.host_port) as s:  # what an eavesdropper records of a real fetch
        header = request_auth.sign(KEY, "GET", path, time.time(), auth.nonce())
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{request_auth.HEADER}: {header}\r\n\r\n".encode())
        recorded = bytearray()
        while chunk := s.recv(1 << 20):
            recorded += chunk
    assert recorded.startswith(b"HTTP/1.1 200") and len(recorded) > STATE_BYTES
    listener, thread = _replaying(bytes(recorded))
    try:
        host, port = listener.getsockname()[:2]
        with pytest.raises(TransferError, match="manifest .* does not verify under the job secret") as refused:
            fetch(source, f"{host}:{port}")
        assert not refused.value.model.any()
    finally:
        listener.close()
        thread.join(10)
    assert torch.equal(fetch(source), expected_state())
