"""One fan-out + vote round of the real leader channel against N simulated ranks.

For benchmarks and the at-scale simulation: the leader side is the production
`LeaderChannel`; the ranks are asyncio connections on one extra thread that answer
each plan with a yes vote and wait for the decision.
"""

from __future__ import annotations

import asyncio
import json
import resource
import threading
import time
from dataclasses import dataclass

from fthsdp.commit_votes import Outcome, Vote
from fthsdp.intra_replica_channel import FRAME, LeaderChannel, encode


@dataclass(frozen=True)
class RoundTimings:
    ranks: int
    connect_s: float
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


async def _simulated_rank(address: str, rank: int, got_plan: list[float], got_decision: list[float],
                          ready: asyncio.Semaphore) -> None:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(encode({"t": "hello", "rank": rank}))
    await writer.drain()
    ready.release()
    plan = await _read(reader)
    got_plan.append(time.perf_counter())
    view = plan["view"]
    writer.write(encode({"t": "vote", "rank": rank, "quorum_id": view["quorum_id"], "step": view["step"],
                         "ok": True, "reason": ""}))
    await writer.drain()
    await _read(reader)
    got_decision.append(time.perf_counter())
    writer.close()


def simulate_fanout_and_vote(n_ranks: int, timeout_s: float = 120.0) -> RoundTimings:
    """Run one plan fan-out + commit vote with `n_ranks` ranks (rank 0 is the leader)."""
    _raise_fd_limit(2 * n_ranks + 256)
    leader = LeaderChannel("127.0.0.1", 0, n_ranks).start()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="simulated-ranks", daemon=True)
    thread.start()
    got_plan: list[float] = []
    got_decision: list[float] = []
    try:
        t0 = time.perf_counter()

        async def launch() -> list[asyncio.Task]:
            ready = asyncio.Semaphore(0)
            tasks = [asyncio.ensure_future(_simulated_rank(leader.address, r, got_plan, got_decision, ready))
                     for r in range(1, n_ranks)]
            for _ in range(n_ranks - 1):
                await ready.acquire()
            return tasks
        tasks = asyncio.run_coroutine_threadsafe(launch(), loop).result(timeout_s)
        leader.wait_for_ranks(timeout_s)
        connect_s = time.perf_counter() - t0
        view = {"quorum_id": 1, "step": 0}
        start = time.perf_counter()
        leader.broadcast({"t": "plan", "view": view}, timeout_s)
        decision = leader.collect_votes(1, 0, Vote(0, 1, 0, True), timeout_s)
        voted = time.perf_counter()
        leader.broadcast({"t": "decision", "quorum_id": 1, "step": 0, "outcome": decision.outcome.value,
                          "reason": decision.reason}, timeout_s)
        asyncio.run_coroutine_threadsafe(asyncio.wait_for(asyncio.gather(*tasks), timeout_s), loop).result()
        return RoundTimings(n_ranks, connect_s, (max(got_plan, default=start) - start),
                            voted - start, max(got_decision, default=voted) - start,
                            decision.outcome.value if decision.outcome is not Outcome.PENDING else "pending")
    finally:
        leader.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)
