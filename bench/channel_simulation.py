"""Rounds of the real coordinator against N simulated ranks, for benchmarks and the at-scale run.

The coordinator is the production `CoordinatorService` (sockets, frames, the pure
coordination). Its controller is a stand-in that answers every quorum at once (the first
answer with addresses, later ones without, as the controller does when the quorum id
holds), so what is measured is the replica's own fan-out. The ranks are non-blocking
sockets on one selector in one child process: each authenticates (challenge, tagged hello,
welcome) with a job secret made for the run, begins a step, votes yes on the plan, and
begins the next step when the decision arrives -- the least work per message, so the
measurement is dominated by the coordinator's side.

With relays (`relay_fanout`, as RuntimeSettings.relay_fanout: 0 is automatic, relays above 64
ranks), the production `RelayService`s run in `relay_processes` more child processes, many
relays on one event loop each, and the simulated ranks follow the coordinator's welcome to
their relay. The coordinator's process hosts nothing else, so its CPU time over the rounds
is the leader's own work (`leader_cpu_s`, per round).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import multiprocessing
import resource
import selectors
import socket
import time
from dataclasses import dataclass

from fthsdp.settings import RuntimeSettings
from fthsdp.step import coordination as co
from fthsdp.step import messages as msg
from fthsdp.step.coordinator import CoordinatorService
from fthsdp.step.relay import RelayService
from protos import controller_pb2 as pb
from protos import job_secret

JOB, REPLICA = "sim", "r0"


@dataclass(frozen=True)
class RoundTimings:
    ranks: int
    connect_s: float
    broadcast_s: float     # the coordinator's own cost: writing the plan to every socket
    fanout_s: float        # plan broadcast until every rank holds it
    vote_s: float          # plan broadcast until the coordinator decided
    decision_s: float      # plan broadcast until every rank holds the decision
    outcome: str
    relays: int = 0
    leader_cpu_s: float = 0.0  # the coordinator process's CPU time per round (averaged over the rounds)
    loop_cpu_s: float | None = None  # the coordinator loop thread's CPU in this round (None: the first)


class InstantController:
    """Answers every quorum at once: this replica alone, healthy, at the asked step."""

    def __init__(self) -> None:
        self.quorums = 0

    def quorum(self, request: co.RequestQuorum, world_size: int, coordinator_address: str,
               timeout_s: float) -> pb.QuorumResponse:
        self.quorums += 1
        full = request.known_quorum_id != 1
        member = pb.Member(replica_id=REPLICA, step=request.step, healthy=True,
                           ftar_addresses=list(request.ftar_addresses) if full else [],
                           state_addresses=list(request.state_addresses) if full else [])
        return pb.QuorumResponse(quorum_id=1, members=[member], max_step=request.step, lr_scale=1.0,
                                 addresses_included=full, total_replicas=1)

    def report_step(self, report: co.ReportStep) -> None:
        pass

    def report_failure(self, report: co.ReportFailure) -> None:
        pass

    def report_finished(self, report: co.ReportFinished) -> str:
        return "RUNNING"

    def close(self) -> None:
        pass


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


class _SimulatedRanks:
    def __init__(self, address: str, ranks: range, n_ranks: int, key: bytes) -> None:
        host, _, port = address.rpartition(":")
        self.selector = selectors.DefaultSelector()
        self.readers: dict[socket.socket, msg.FrameReader] = {}
        for rank in ranks:
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES)
            kind, challenge = _next_frame(sock, reader)
            hello = msg.sign_hello(key, msg.hello(rank, n_ranks, JOB, REPLICA, f"127.0.0.1:{10000 + rank % 50000}",
                                                  f"127.0.0.1:{20000 + rank % 40000}", "sim"), challenge.nonce)
            sock.sendall(msg.frame(hello))
            kind, welcome = _next_frame(sock, reader)
            if kind != "welcome" or not msg.welcome_is_authentic(key, welcome, hello.hello, challenge.nonce):
                raise RuntimeError(f"simulated rank {rank} was not welcomed: {kind} {welcome}")
            if welcome.relay_address:  # this rank talks to its relay: hello again there
                sock.close()
                relay_host, _, relay_port = welcome.relay_address.rpartition(":")
                sock = socket.create_connection((relay_host, int(relay_port)), timeout=30)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reader = msg.FrameReader(msg.MAX_COORDINATOR_FRAME_BYTES)
                kind, challenge = _next_frame(sock, reader)
                hello = msg.sign_hello(key, hello, challenge.nonce)
                sock.sendall(msg.frame(hello))
                kind, welcome = _next_frame(sock, reader)
                if kind != "welcome" or not msg.welcome_is_authentic(key, welcome, hello.hello, challenge.nonce):
                    raise RuntimeError(f"simulated rank {rank} was not welcomed by its relay: {kind} {welcome}")
            sock.setblocking(False)
            self.readers[sock] = reader
            self.selector.register(sock, selectors.EVENT_READ, rank)

    def play_round(self, step: int, timeout_s: float) -> tuple[float, float]:
        """Begin `step` on every socket, vote yes on its plan, read its decision; returns when
        the last plan and the last decision arrived."""
        begin = msg.frame(msg.begin(step))
        for sock in self.readers:
            sock.sendall(begin)
        expected = len(self.readers)
        decisions = 0
        last_plan = last_decision = 0.0
        deadline = time.monotonic() + timeout_s
        while decisions < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expected - decisions} simulated ranks got no decision in {timeout_s}s")
            for key, _ in self.selector.select(1.0):
                sock = key.fileobj
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise ConnectionError(f"the coordinator closed rank {key.data}'s connection")
                for body in self.readers[sock].feed(chunk):
                    kind, message = msg.decode_coordinator_frame(body)
                    if kind == "plan":
                        last_plan = time.perf_counter()
                        sock.sendall(msg.frame(msg.vote(message.attempt, True, "", 0.0, 0)))
                    elif kind == "decision":
                        decisions += 1
                        last_decision = time.perf_counter()
                    else:
                        raise RuntimeError(f"simulated rank {key.data} got a {kind}: {message}")
        return last_plan, last_decision

    def close(self, step: int, timeout_s: float) -> None:
        """Close every rank cleanly (each waits for the coordinator's last word), then hang up."""
        bye = msg.frame(msg.close(step, "simulation over"))
        for sock in self.readers:
            sock.setblocking(True)
            sock.sendall(bye)
        for sock, reader in self.readers.items():
            sock.settimeout(timeout_s)
            finished = False
            while not finished:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise ConnectionError("the coordinator hung up before its last word")
                finished = any(msg.decode_coordinator_frame(b)[0] == "finished" for b in reader.feed(chunk))
        for sock in self.readers:
            sock.close()
        self.selector.close()


def _next_frame(sock: socket.socket, reader: msg.FrameReader) -> tuple[str, object]:
    """The next frame on a blocking socket (handshakes only: nothing else is in flight)."""
    while True:
        chunk = sock.recv(1 << 16)  # the socket's timeout bounds each wait
        if not chunk:
            raise ConnectionError("the coordinator closed a simulated rank's connection during its hello")
        bodies = reader.feed(chunk)
        if bodies:
            assert len(bodies) == 1, "one frame at a time during the handshake"
            return msg.decode_coordinator_frame(bodies[0])


def _ranks_process(address: str, mine: range, n_ranks: int, rounds: int, conn, timeout_s: float, key: bytes) -> None:
    """Child process: connect the simulated ranks `mine`, report ready, play the rounds on "go"."""
    _raise_fd_limit(len(mine) + 256)
    ranks = _SimulatedRanks(address, mine, n_ranks, key)
    conn.send("ready")
    try:
        conn.recv()
        conn.send([ranks.play_round(step, timeout_s) for step in range(rounds)])
        ranks.close(rounds, timeout_s)
    finally:
        conn.close()


def _relays_process(settings: RuntimeSettings, coordinator: str, relay_ranks: list[int], conn) -> None:
    """Child process: host the relays of `relay_ranks` on one event loop until told to stop."""
    _raise_fd_limit(len(relay_ranks) * (settings.relay_tree().fanout + 8) + 256)

    async def main() -> None:
        relays = [RelayService(dataclasses.replace(settings, rank=r), coordinator, "127.0.0.1") for r in relay_ranks]
        await asyncio.gather(*(r.open() for r in relays))
        conn.send("ready")
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # "stop"
        await asyncio.gather(*(r.aclose(linger_s=1.0) for r in relays))
    try:
        asyncio.run(main())
    finally:
        conn.close()


def simulate_fanout_and_vote(n_ranks: int, timeout_s: float = 120.0, relay_fanout: int = 0) -> RoundTimings:
    """One begin + plan fan-out + vote + decision round with `n_ranks` ranks."""
    return simulate_rounds(n_ranks, 1, timeout_s, relay_fanout)[0]


def simulate_rounds(n_ranks: int, rounds: int, timeout_s: float = 120.0, relay_fanout: int = 0,
                    relay_processes: int = 1, rank_processes: int = 1) -> list[RoundTimings]:
    """Run `rounds` step rounds over the same connections with `n_ranks` simulated ranks (split
    over `rank_processes` processes, where there are cores for them)."""
    _raise_fd_limit(n_ranks + 256)
    secret = job_secret.parse(job_secret.generate(), "the simulation")
    settings = RuntimeSettings(job_id=JOB, replica_id=REPLICA, world_size=n_ranks, controller_address="127.0.0.1:1",
                               coordinator_address="127.0.0.1:0", quorum_timeout_s=timeout_s,
                               gather_timeout_s=timeout_s, allreduce_timeout_s=timeout_s, digest_every_steps=0, job_secret=secret,
                               relay_fanout=relay_fanout).validate()
    relay_ranks = list(settings.relay_tree().relays)
    service = CoordinatorService(settings, InstantController(), "127.0.0.1", 0)
    service.marks = collections.deque(maxlen=max(rounds, 1) * 4)
    service.start()
    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded process
    sims = []  # (process, pipe) of each simulated-ranks process
    k = max(1, min(rank_processes, n_ranks))
    for i in range(k):
        parent, child = ctx.Pipe()
        sims.append((ctx.Process(target=_ranks_process, daemon=True, args=(
            service.address, range(i * n_ranks // k, (i + 1) * n_ranks // k), n_ranks, rounds, child, timeout_s,
            secret.key(job_secret.PURPOSE_COORDINATOR))), parent))
    hosts = []  # (process, pipe) of each relay process
    try:
        t0 = time.perf_counter()
        n_hosts = min(max(relay_processes, 1), len(relay_ranks))
        for i in range(n_hosts):
            mine, theirs = ctx.Pipe()
            host = ctx.Process(target=_relays_process, daemon=True,
                               args=(settings, service.address, relay_ranks[i::n_hosts], theirs))
            host.start()
            hosts.append((host, mine))
        for host, pipe in hosts:
            if not pipe.poll(timeout_s) or pipe.recv() != "ready":
                raise TimeoutError(f"the relays did not connect within {timeout_s}s")
        for proc, pipe in sims:
            proc.start()
        for proc, pipe in sims:
            if not pipe.poll(timeout_s) or pipe.recv() != "ready":
                raise TimeoutError(f"{n_ranks} simulated ranks did not connect within {timeout_s}s")
        connect_s = time.perf_counter() - t0
        cpu0 = time.process_time()
        for proc, pipe in sims:
            pipe.send("go")
        per_process = []
        for proc, pipe in sims:
            if not pipe.poll(timeout_s * rounds):
                raise TimeoutError("simulated ranks did not finish the rounds")
            per_process.append(pipe.recv())
        lasts = [tuple(map(max, zip(*of_round))) for of_round in zip(*per_process)]  # the last rank's, per round
        leader_cpu_s = (time.process_time() - cpu0) / max(rounds, 1)
        marks = list(service.marks)
        plans = [(at, write_s) for kind, at, write_s, _, _ in marks if kind == "plan"]
        decisions = [(at, outcome.lower()) for kind, at, _, outcome, _ in marks if kind == "decision"]
        loop_cpu = [cpu for kind, _, _, _, cpu in marks if kind == "decision"]
        # The coordinator loop's CPU from one decision to the next: a whole round (begins, plan,
        # votes, decision); the first round, which also carries every rank's addresses, has none.
        round_cpu = [None] + [b - a for a, b in zip(loop_cpu, loop_cpu[1:])]
        return [RoundTimings(n_ranks, connect_s, write_s, max(last_plan, start) - start, voted - start,
                             max(last_decision, voted) - start, outcome, len(relay_ranks), leader_cpu_s, loop_s)
                for (start, write_s), (voted, outcome), (last_plan, last_decision), loop_s
                in zip(plans, decisions, lasts, round_cpu)]
    finally:
        for host, pipe in hosts:
            try:
                pipe.send("stop")
            except OSError:
                pass
        service.close(linger_s=1.0)
        for p in [proc for proc, _ in sims] + [host for host, _ in hosts]:
            if p.pid is None:
                continue  # never started
            p.join(10.0)
            if p.is_alive():
                p.kill()
