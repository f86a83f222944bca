"""One fan-out + vote round of the real leader channel against N simulated ranks.

For benchmarks and the at-scale simulation: the leader side is the production
`LeaderChannel`; the ranks are asyncio connections in one child process that answer
each plan with a yes vote and wait for the decision.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import resource
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


async def _read(reader: asyncio.StreamReader) -> dict:
    (n,) = FRAME.unpack(await reader.readexactly(FRAME.size))
    return json.loads(await reader.readexactly(n))


async def _simulated_rank(address: str, rank: int, rounds: int, got_plan: list[list[float]],
                          got_decision: list[list[float]], ready: asyncio.Semaphore) -> None:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(encode({"t": "hello", "rank": rank}))
    await writer.drain()
    ready.release()
    for i in range(rounds):
        plan = await _read(reader)
        got_plan[i].append(time.perf_counter())
        view = plan["view"]
        writer.write(encode({"t": "vote", "rank": rank, "quorum_id": view["quorum_id"], "step": view["step"],
                             "ok": True, "reason": ""}))
        await writer.drain()
        await _read(reader)
        got_decision[i].append(time.perf_counter())
    writer.close()


def _ranks_process(address: str, n_ranks: int, rounds: int, conn, timeout_s: float) -> None:
    """Child process: connect n_ranks - 1 simulated ranks, report ready, play the rounds."""
    _raise_fd_limit(n_ranks + 256)
    got_plan: list[list[float]] = [[] for _ in range(rounds)]
    got_decision: list[list[float]] = [[] for _ in range(rounds)]

    async def run() -> None:
        ready = asyncio.Semaphore(0)
        tasks = [asyncio.ensure_future(_simulated_rank(address, r, rounds, got_plan, got_decision, ready))
                 for r in range(1, n_ranks)]
        for _ in range(n_ranks - 1):
            await ready.acquire()
        conn.send("ready")
        await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)

    asyncio.run(run())
    conn.send([(max(p, default=0.0), max(d, default=0.0)) for p, d in zip(got_plan, got_decision)])
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
