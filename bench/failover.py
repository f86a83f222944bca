"""Controller failover time on a real etcd.

    python -m bench.failover --json

Two controllers share one etcd; a replica leader keeps training. Each trial SIGKILLs the
active controller and measures until the next quorum is answered by the new leader.
Prints one JSON line: failover_s (median), the trials, and the lease TTL used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time

from protos import controller_pb2 as pb
from protos.dial import FailoverChannel


async def one_trial(controllers, leader_index: int, step: int) -> tuple[float, int]:
    from tests.ha.cluster import JOB

    client = FailoverChannel([c.grpc for c in controllers], attempt_timeout_s=2.0, total_timeout_s=60.0)
    client.index = leader_index
    try:
        await client.call("Quorum", pb.QuorumRequest(job_id=JOB, replica_id="r0", step=step, world_size=1))
        await client.call("ReportStep", pb.ReportStepRequest(job_id=JOB, replica_id="r0", step=step))
        controllers[leader_index].signal(signal.SIGKILL)
        start = time.perf_counter()
        await client.call("Quorum", pb.QuorumRequest(job_id=JOB, replica_id="r0", step=step + 1, world_size=1))
        elapsed = time.perf_counter() - start
        await client.call("ReportStep", pb.ReportStepRequest(job_id=JOB, replica_id="r0", step=step + 1))
        return elapsed, client.index
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    from tests.etcd_server import EtcdServer
    from tests.ha.cluster import ControllerProcess

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--lease-ttl-s", type=float, default=2.0)
    p.add_argument("--json", action="store_true", help="print one JSON line (the default output)")
    args = p.parse_args(argv)
    if args.trials < 1:
        p.error(f"--trials must be at least 1, got {args.trials}")
    etcd = EtcdServer.start_new()
    controllers = []
    times = []
    try:
        controllers = [ControllerProcess(etcd.endpoint, replicas=1, lease_ttl_s=args.lease_ttl_s).start()
                       for _ in range(2)]
        step = 0
        for _ in range(args.trials):
            deadline = time.monotonic() + 30
            while not any(c.leads() for c in controllers):
                if time.monotonic() > deadline:
                    raise RuntimeError("no controller became leader within 30 s")
                time.sleep(0.05)
            leader = next(i for i, c in enumerate(controllers) if c.leads())
            elapsed, _ = asyncio.run(one_trial(controllers, leader, step))
            times.append(elapsed)
            step += 2
            controllers[leader].proc.wait(timeout=10)
            controllers[leader] = ControllerProcess(etcd.endpoint, replicas=1, lease_ttl_s=args.lease_ttl_s).start()
    finally:
        for c in controllers:
            c.stop()
        etcd.close()
    print(json.dumps({"failover_s": round(statistics.median(times), 3), "trials": [round(t, 3) for t in times],
                      "lease_ttl_s": args.lease_ttl_s}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
