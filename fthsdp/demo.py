"""`fthsdp demo`: a local controller with simulated replica leaders, one of which fails and
comes back behind, with the status table printed as it goes.

This is the control-plane demo: no model is trained, only the control messages flow.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import grpc
import httpx

from fthsdp.status import render
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg

STEP_S = 0.05


async def _picture(http: httpx.AsyncClient) -> str:
    parts = {}
    for name, path in (("job", "/api/v1/job"), ("replicas", "/api/v1/replicas"), ("hosts", "/api/v1/hosts"),
                       ("quorums", "/api/v1/quorums"), ("events", "/api/v1/events?limit=5")):
        parts[name] = (await http.get(path)).json()
    return render(**parts)


async def run(replicas: int, steps: int, fail_at: int, back_at: int) -> int:
    from controller.service.server import ControllerServer
    from controller.settings import ControllerSettings

    server = ControllerServer(ControllerSettings(job_id="demo", replicas=replicas, min_replicas=max(1, replicas // 2),
                                                 join_timeout_s=1.0, heartbeat_timeout_s=3.0))
    await server.start()
    await server.wait_leading(10)
    print(f"controller: gRPC {server.grpc_address}, REST {server.http_url}")
    victim = f"r{replicas - 1}"
    progress = {"max_step": 0}
    shown: set[int] = set()

    async def leader(stub, rid: str) -> None:
        step, dead = 0, False
        while progress["max_step"] < steps:
            if rid == victim and fail_at <= progress["max_step"] < back_at:
                if not dead:  # the trainer dies; its agent reports it at once
                    dead = True
                    await stub.ReportFailure(pb.ReportFailureRequest(
                        job_id="demo", replica_id=rid, kind=pb.ReportFailureRequest.REPLICA_DEAD,
                        reason="demo: trainer killed"))
                await asyncio.sleep(STEP_S)
                continue
            q = await stub.Quorum(pb.QuorumRequest(job_id="demo", replica_id=rid, step=step, world_size=1),
                                  timeout=10)
            await asyncio.sleep(STEP_S)  # "train": a behind replica fetches state and sends zeros
            await stub.ReportStep(pb.ReportStepRequest(job_id="demo", replica_id=rid, step=q.max_step,
                                                       quorum_id=q.quorum_id, loss=1.0 / (q.max_step + 1)))
            step = q.max_step + 1
            progress["max_step"] = max(progress["max_step"], step)

    async def monitor(http) -> None:
        for mark in (1, fail_at + 1, back_at + 2, steps):
            while progress["max_step"] < mark:
                await asyncio.sleep(STEP_S / 2)
            print(f"\n=== step {progress['max_step']} ===\n{await _picture(http)}", flush=True)

    try:
        async with grpc.aio.insecure_channel(server.grpc_address) as channel, \
                httpx.AsyncClient(base_url=server.http_url) as http:
            stub = pbg.ControllerStub(channel)
            await asyncio.gather(monitor(http), *(leader(stub, f"r{i}") for i in range(replicas)))
    finally:
        await server.stop()
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fthsdp demo", description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--fail-at", type=int, default=6)
    p.add_argument("--back-at", type=int, default=12)
    args = p.parse_args(argv)
    if args.replicas < 2 or args.steps < 1:
        p.error(f"need --replicas >= 2 and --steps >= 1, got {args.replicas} and {args.steps}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return asyncio.run(run(args.replicas, args.steps, args.fail_at, args.back_at))
