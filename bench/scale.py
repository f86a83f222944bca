"""The control plane at 100K-GPU shape on one machine (the paper's §6 "shadow modules").

    python -m bench.scale --replicas 12 --ranks-per-replica 8192 --hosts-per-replica 1024 --json

The real controller runs as its own process. Simulated agents register every host and keep a
real heartbeat for each of them (many hosts' beats on one stream, each with the agent secret its
registration gave it: the controller checks every one, as from real agents); simulated
replica leaders (real gRPC, one QuorumStream each) join quorums with every rank's addresses
and commit steps; quorum latency is timed from the release of a round to its last answer
(commit reports go between rounds). Then one replica's real intra-replica rounds (begin, plan
fan-out, vote, decision) run at full rank count (the production coordinator service on rank
0's side, the production relays in their own processes -- about sqrt(N) of them, one event
loop per process -- the ranks simulated as sockets on one selector in one process; the
leader's CPU per round is the coordinator process's). The controller runs with a job secret
made for the run: the simulated agents register with its proofs and the leaders show their
hosts' trainer tokens, so authentication is in every figure.

Prints one JSON line (FIELDS): replicas, ranks_per_replica, hosts, gpus, rounds, quorum_p50_ms,
quorum_p99_ms, register_all_hosts_s, host_heartbeats_sent, controller_cpu_pct,
controller_rss_mib; the fan-out part's fanout_commit_p50_ms, fanout_commit_p99_ms,
fanout_p50_ms, leader_broadcast_p50_ms, leader_cpu_ms_per_round, relays; cpus and
load_average_1m.

    python -m bench.scale --fanout-only --compare-direct --json   # the fan-out part, relays vs direct
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

import grpc

from bench.common import secret_file
from bench.procstat import cpu_seconds, rss_mib
from bench.quorum import percentile
from controller.launch import launch
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from protos import credentials, job_secret
from protos.job_secret import JobSecret

JOB = "scale"
#: the fields of the JSON line (`python -m bench.scale --json`, both parts) and their types
FIELDS = {"replicas": int, "ranks_per_replica": int, "hosts": int, "gpus": int, "rounds": int,
          "quorum_p50_ms": float, "quorum_p99_ms": float, "register_all_hosts_s": float, "host_heartbeats_sent": int,
          "controller_cpu_pct": float, "controller_rss_mib": float, "fanout_commit_p50_ms": float,
          "fanout_commit_p99_ms": float, "fanout_p50_ms": float, "leader_broadcast_p50_ms": float,
          "leader_cpu_ms_per_round": float, "relays": int, "cpus": int, "load_average_1m": float}


async def register_hosts(stub, secret: JobSecret, replicas: int, hosts_per_replica: int, ranks: int,
                         concurrency: int) -> dict[str, str]:
    """Every host registered as its agent would (a proof of the job secret); {host: agent secret}."""
    per_host = ranks // hosts_per_replica
    jobs = [(f"host-{r:02d}-{h:05d}", f"r{r:02d}", list(range(h * per_host, (h + 1) * per_host)))
            for r in range(replicas) for h in range(hosts_per_replica)]
    gate = asyncio.Semaphore(concurrency)
    secrets: dict[str, str] = {}

    async def one(host, replica, host_ranks):
        async with gate:
            answer = await stub.RegisterAgent(pb.RegisterAgentRequest(
                host_id=host, incarnation="1", slots=per_host, labels={"zone": f"z{int(replica[1:]) % 4}"},
                assignment=pb.Assignment(replica_id=replica, ranks=host_ranks, world_size=ranks),
                proof=credentials.registration_proof(secret, host, "1", time.time())), timeout=60)
            secrets[host] = answer.agent_secret

    await asyncio.gather(*(one(*j) for j in jobs))
    return {j[0]: secrets[j[0]] for j in jobs}


async def heartbeat_forever(stub, hosts: dict[str, str], interval_s: float, stop: asyncio.Event) -> int:
    """Each host's heartbeat with its own agent secret (an agent beats for its own host only),
    every `interval_s`, many hosts multiplexed on one stream; the beats sent."""
    sent = 0

    async def beats():
        nonlocal sent
        while not stop.is_set():
            for host, agent_secret in hosts.items():
                yield pb.HeartbeatRequest(host_ids=[host], agent_secret=agent_secret)
                sent += 1
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except asyncio.TimeoutError:
                pass

    async for answer in stub.Heartbeat(beats()):
        if answer.unknown_ids:  # a refused beat would let the controller declare live hosts dead
            raise RuntimeError(f"the controller does not know the hosts {list(answer.unknown_ids)[:5]}")
    return sent


async def run(args) -> dict:
    text = job_secret.generate()  # one per run: the simulated agents and leaders prove it as real ones do
    secret = job_secret.parse(text, "bench.scale")
    with tempfile.TemporaryDirectory(prefix="fthsdp-bench-scale-") as tmp:
        ctl = launch("--job-id", JOB, "--replicas", str(args.replicas), "--min-replicas",
                     str(max(1, args.replicas // 2 + 1)), "--join-timeout-s", "30", "--heartbeat-timeout-s",
                     str(args.heartbeat_timeout_s), "--log-level", "WARNING",
                     *(["--no-telemetry"] if args.no_telemetry else []),
                     "--job-secret-file", str(secret_file(tmp, text)))
    pid, info = ctl.pid, {"grpc": ctl.grpc}
    try:
        channels = [grpc.aio.insecure_channel(info["grpc"], options=[("grpc.max_send_message_length", 64 << 20),
                                                                     ("grpc.max_receive_message_length", 64 << 20)])
                    for _ in range(args.replicas + 1)]
        admin = pbg.ControllerStub(channels[-1])
        t0 = time.perf_counter()
        hosts = await register_hosts(admin, secret, args.replicas, args.hosts_per_replica, args.ranks_per_replica, 64)
        register_s = time.perf_counter() - t0
        stop = asyncio.Event()
        streams = 4
        names = list(hosts)
        beaters = [asyncio.create_task(heartbeat_forever(admin, {h: hosts[h] for h in names[i::streams]},
                                                         args.heartbeat_interval_s, stop))
                   for i in range(streams)]
        # each leader shows the trainer token of the host holding its rank 0, as its agent hands it
        leads = [credentials.host_credential(credentials.trainer_token(secret, f"host-{r:02d}-00000"))
                 for r in range(args.replicas)]
        leaders = [pbg.ControllerStub(c) for c in channels[:-1]]
        known = [0] * args.replicas
        world = args.ranks_per_replica
        addresses = {r: ([f"10.{r}.{k // 256}.{k % 256}:29500" for k in range(world)],
                         [f"10.{r}.{k // 256}.{k % 256}:29600" for k in range(world)]) for r in range(args.replicas)}

        quorum_streams = [stub.QuorumStream() for stub in leaders]  # one long-lived stream per leader

        async def leader(r: int, step: int) -> None:
            first = known[r] == 0
            await quorum_streams[r].write(pb.QuorumRequest(
                job_id=JOB, replica_id=f"r{r:02d}", step=step, world_size=world, known_quorum_id=known[r],
                host_id=f"host-{r:02d}-00000", credential=leads[r],  # the host holding rank 0 leads
                ftar_addresses=addresses[r][0] if first else [], state_addresses=addresses[r][1] if first else []))
            reply = await asyncio.wait_for(quorum_streams[r].read(), 60)
            if reply is grpc.aio.EOF:
                raise RuntimeError(f"leader r{r:02d}: the controller ended its quorum stream")
            known[r] = reply.quorum_id

        async def report(r: int, step: int) -> None:
            await leaders[r].ReportStep(pb.ReportStepRequest(job_id=JOB, replica_id=f"r{r:02d}", step=step,
                                                             quorum_id=known[r], step_time_s=1.0,
                                                             host_id=f"host-{r:02d}-00000", credential=leads[r]))

        await asyncio.gather(*(leader(r, 0) for r in range(args.replicas)))  # first join carries addresses
        await asyncio.gather(*(report(r, 0) for r in range(args.replicas)))
        cpu0, wall0 = cpu_seconds(pid), time.perf_counter()
        latencies = []
        for step in range(1, args.rounds + 1):
            start = time.perf_counter()
            await asyncio.gather(*(leader(r, step) for r in range(args.replicas)))
            latencies.append((time.perf_counter() - start) * 1000)
            await asyncio.gather(*(report(r, step) for r in range(args.replicas)))
            await asyncio.sleep(args.step_s)  # the step itself: heartbeats keep flowing meanwhile
        cpu_pct = 100 * (cpu_seconds(pid) - cpu0) / (time.perf_counter() - wall0)
        stop.set()
        for qs in quorum_streams:
            await qs.done_writing()
        beats = sum(await asyncio.gather(*beaters))
        for c in channels:
            await c.close()
        return {
            "replicas": args.replicas, "ranks_per_replica": world, "step_s": args.step_s,
            "heartbeat_interval_s": args.heartbeat_interval_s, "hosts": len(hosts), "gpus": args.replicas * world,
            "rounds": len(latencies), "quorum_p50_ms": round(statistics.median(latencies), 2),
            "quorum_p99_ms": round(percentile(latencies, 99), 2), "register_all_hosts_s": round(register_s, 2),
            "host_heartbeats_sent": beats, "controller_cpu_pct": round(cpu_pct, 1),
            "controller_rss_mib": round(rss_mib(pid), 1), "telemetry": not args.no_telemetry,
        }
    finally:
        ctl.stop(30.0)


def fanout(ranks: int, rounds: int, relay_fanout: int = 0, relay_processes: int = 1, rank_processes: int = 1,
           prefix: str = "") -> dict:
    """One replica's real coordinator rounds at full rank count: through relays (relay_fanout as
    RuntimeSettings', 0 automatic; >= ranks: every rank talks to the coordinator)."""
    from bench.channel_simulation import simulate_rounds

    rounds_ = simulate_rounds(ranks, rounds, relay_fanout=relay_fanout, relay_processes=relay_processes,
                              rank_processes=rank_processes)
    decision_ms = [r.decision_s * 1000 for r in rounds_]
    out = {"fanout_commit_p50_ms": round(statistics.median(decision_ms), 1),
           "fanout_commit_p99_ms": round(percentile(decision_ms, 99), 1),
           "fanout_p50_ms": round(statistics.median(r.fanout_s * 1000 for r in rounds_), 1),
           "leader_broadcast_p50_ms": round(statistics.median(r.broadcast_s * 1000 for r in rounds_), 2),
           "leader_cpu_ms_per_round": round(rounds_[0].leader_cpu_s * 1000, 1),
           "leader_loop_cpu_p50_ms": round(statistics.median(r.loop_cpu_s * 1000 for r in rounds_[1:]), 2)
           if len(rounds_) > 1 else None,
           "relays": rounds_[0].relays, "relay_processes": relay_processes if rounds_[0].relays else 0,
           "rank_processes": rank_processes,
           "fanout_rounds": len(rounds_)}
    return {prefix + k: v for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=12)
    p.add_argument("--ranks-per-replica", type=int, default=8192)
    p.add_argument("--hosts-per-replica", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    p.add_argument("--step-s", type=float, default=0.1, help="time between rounds (the simulated step)")
    p.add_argument("--heartbeat-timeout-s", type=float, default=30.0)
    p.add_argument("--fanout-rounds", type=int, default=10, help="0 skips the intra-replica fan-out part")
    p.add_argument("--relay-fanout", type=int, default=0,
                   help="ranks per relay group in the fan-out part (0: about sqrt(ranks); >= ranks: no relays)")
    p.add_argument("--relay-processes", type=int, default=1, help="processes hosting the relays (one loop each)")
    p.add_argument("--rank-processes", type=int, default=1, help="processes the simulated ranks are split over")
    p.add_argument("--compare-direct", action="store_true",
                   help="also run the fan-out part without relays (fields prefixed direct_)")
    p.add_argument("--fanout-only", action="store_true", help="skip the controller (quorum) part")
    p.add_argument("--json", action="store_true", help="print one JSON line (the default output)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="run the controller without live goodput, failure histograms and event log")
    args = p.parse_args(argv)
    if args.ranks_per_replica % args.hosts_per_replica:
        p.error(f"--ranks-per-replica {args.ranks_per_replica} must be a multiple of --hosts-per-replica "
                f"{args.hosts_per_replica}")
    result = {"ranks_per_replica": args.ranks_per_replica} if args.fanout_only else asyncio.run(run(args))
    if args.fanout_rounds > 0:
        result.update(fanout(args.ranks_per_replica, args.fanout_rounds, args.relay_fanout, args.relay_processes,
                             args.rank_processes))
        if args.compare_direct:
            result.update(fanout(args.ranks_per_replica, args.fanout_rounds, args.ranks_per_replica,
                                 rank_processes=args.rank_processes, prefix="direct_"))
        result["load_average_1m"] = round(os.getloadavg()[0], 2)
        result["cpus"] = os.cpu_count()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
