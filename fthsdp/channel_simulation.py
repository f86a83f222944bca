"""One fan-out + vote round of the real leader channel against N simulated ranks.

For benchmarks and the at-scale simulation: the leader side is the production
`LeaderChannel`; the ranks are non-blocking sockets on one selector in one child process
that answer each plan with a yes vote and wait for the decision.
"""

from __future__ import annotations

import json
import multiprocessing
import resource
import selectors
import socket
import time
from dataclasses import dataclass

from fthsdp.commit_votes import Vote
from fthsdp.intra_replica_channel import FRAME, LeaderChannel, encode


@dataclass(frozen=True)
class RoundTimings:
    ranks: int
    connect_s: float
    broadcast_s: float     # the leader's own cost: writing the plan to every socket
    fanout_s: float        # plan broadcast until every rank holds it
    vote_s: float          # plan broadcast until the leader decided
    decision_s: float      # plan broadcast until every rank holds the decision
    outcome: str


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


class _SimulatedRanks:
    """Ranks 1..n-1 as non-blocking sockets on one selector: each answers a plan with a yes
    vote and waits for the decision, as a real rank does, at the least cost per message, so
    the measurement is dominated by the leader's side rather than by the simulation."""

    def __init__(self, address: str, n_ranks: int) -> None:
        host, _, port = address.rpartition(":")
        self.selector = selectors.DefaultSelector()
        self.buffers: dict[socket.socket, bytearray] = {}
        for rank in range(1, n_ranks):
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(encode({"t": "hello", "rank": rank}))
            sock.setblocking(False)
            self.buffers[sock] = bytearray()
            self.selector.register(sock, selectors.EVENT_READ, rank)

    def play_round(self, timeout_s: float) -> tuple[float, float]:
        """Answer one plan and read one decision on every socket; returns when the last plan
        and the last decision arrived."""
        expected = len(self.buffers)
        plans = decisions = 0
        last_plan = last_decision = 0.0
        deadline = time.monotonic() + timeout_s
        while decisions < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expected - decisions} simulated ranks got no decision in {timeout_s}s")
            for key, _ in self.selector.select(1.0):
                sock, rank = key.fileobj, key.data
                buf = self.buffers[sock]
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError(f"the leader closed rank {rank}'s connection")
                buf += chunk
                while len(buf) >= FRAME.size:
                    (n,) = FRAME.unpack_from(buf)
                    if len(buf) < FRAME.size + n:
                        break
                    msg = json.loads(bytes(buf[FRAME.size:FRAME.size + n]))
                    del buf[:FRAME.size + n]
                    if msg["t"] == "plan":
                        plans += 1
                        last_plan = time.perf_counter()
                        view = msg["view"]
                        sock.sendall(encode({"t": "vote", "rank": rank, "quorum_id": view["quorum_id"],
                                             "step": view["step"], "ok": True, "reason": ""}))
                    else:
                        decisions += 1
                        last_decision = time.perf_counter()
        return last_plan, last_decision

    def close(self) -> None:
        for sock in self.buffers:
            sock.close()
        self.selector.close()


def _ranks_process(address: str, n_ranks: int, rounds: int, conn, timeout_s: float) -> None:
    """Child process: connect n_ranks - 1 simulated ranks, report ready, play the rounds."""
    _raise_fd_limit(n_ranks + 256)
    ranks = _SimulatedRanks(address, n_ranks)
    conn.send("ready")
    try:
        conn.send([ranks.play_round(timeout_s) for _ in range(rounds)])
    finally:
        ranks.close()
        conn.close()


def simulate_fanout_and_vote(n_ranks: int, timeout_s: float = 120.0) -> RoundTimings:
    """One plan fan-out + commit vote with `n_ranks` ranks; see `simulate_rounds`."""
    return simulate_rounds(n_ranks, 1, timeout_s)[0]


def simulate_rounds(n_ranks: int, rounds: int, timeout_s: float = 120.0) -> list[RoundTimings]:
    """Run `rounds` plan fan-outs + commit votes over the same connections, with `n_ranks`
    ranks (rank 0 is the leader, in this process; the others are asyncio connections in one
    child process, as ranks are processes)."""
    _raise_fd_limit(n_ranks + 256)
    leader = LeaderChannel("127.0.0.1", 0, n_ranks).start()
    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded process
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_ranks_process, args=(leader.address, n_ranks, rounds, child, timeout_s), daemon=True)
    try:
        t0 = time.perf_counter()
        proc.start()
        if not parent.poll(timeout_s) or parent.recv() != "ready":
            raise TimeoutError(f"{n_ranks - 1} simulated ranks did not connect within {timeout_s}s")
        leader.wait_for_ranks(timeout_s)
        connect_s = time.perf_counter() - t0
        marks = []
        for step in range(rounds):
            view = {"quorum_id": 1, "step": step}
            start = time.perf_counter()  # CLOCK_MONOTONIC: comparable with the child's readings
            leader.broadcast({"t": "plan", "view": view}, timeout_s)
            broadcast_s = time.perf_counter() - start
            decision = leader.collect_votes(1, step, Vote(0, 1, step, True), timeout_s)
            voted = time.perf_counter()
            leader.broadcast({"t": "decision", "quorum_id": 1, "step": step, "outcome": decision.outcome.value,
                              "reason": decision.reason}, timeout_s)
            marks.append((start, broadcast_s, voted, decision.outcome.value))
        if not parent.poll(timeout_s):
            raise TimeoutError("simulated ranks did not finish the rounds")
        lasts = parent.recv()
        return [RoundTimings(n_ranks, connect_s, broadcast_s, max(last_plan, start) - start, voted - start,
                             max(last_decision, voted) - start, outcome)
                for (start, broadcast_s, voted, outcome), (last_plan, last_decision) in zip(marks, lasts)]
    finally:
        leader.close()
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()
