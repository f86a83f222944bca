"""Quorum latency: a real controller process and N concurrent replica leaders.

    python -m bench.quorum --replicas 2 8 16 64 --rounds 50 --json

For each N: start `fthsdp controller` as its own process, run N leaders (one gRPC channel
each) in this process, and for every round release all N at once and time until the last
answer arrives. Prints one JSON line per N: replicas, p50_ms, p99_ms, rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import grpc

from controller.launch import launch
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg

WARMUP_ROUNDS = 5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def measure(address: str, replicas: int, rounds: int) -> list[float]:
    channels = [grpc.aio.insecure_channel(address) for _ in range(replicas)]
    stubs = [pbg.ControllerStub(c) for c in channels]
    known = [0] * replicas

    async def leader(i: int, step: int) -> None:
        reply = await stubs[i].Quorum(pb.QuorumRequest(
            job_id="bench", replica_id=f"r{i:03d}", step=step, world_size=1, known_quorum_id=known[i],
            ftar_addresses=[f"10.0.{i}.1:29500"], state_addresses=[f"10.0.{i}.1:29600"]), timeout=30)
        known[i] = reply.quorum_id

    latencies = []
    try:
        for step in range(WARMUP_ROUNDS + rounds):
            start = time.perf_counter()
            await asyncio.gather(*(leader(i, step) for i in range(replicas)))
            if step >= WARMUP_ROUNDS:
                latencies.append((time.perf_counter() - start) * 1000)
    finally:
        for c in channels:
            await c.close()
    return latencies


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[2, 8, 16, 64])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--json", action="store_true", help="one JSON line per replica count (the default output)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="run the controller without live goodput, failure histograms and event log")
    args = p.parse_args(argv)
    for n in args.replicas:
        if n < 1:
            p.error(f"--replicas values must be at least 1, got {n}")
        ctl = launch("--replicas", str(n), "--min-replicas", str(n), "--heartbeat-timeout-s", "600",
                     "--join-timeout-s", "60", "--job-id", "bench", "--log-level", "WARNING",
                     *(["--no-telemetry"] if args.no_telemetry else []))
        try:
            lat = asyncio.run(measure(ctl.grpc, n, args.rounds))
        finally:
            ctl.stop()
        print(json.dumps({"replicas": n, "p50_ms": round(statistics.median(lat), 3),
                          "p99_ms": round(percentile(lat, 99), 3), "rounds": len(lat),
                          "telemetry": not args.no_telemetry}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
