"""The chaos test's fault executor: a real job, and the schedule's faults carried out on it.

    recorded = ChaosRun(workdir, settings, make_schedule(seed, settings), seed).run()

The job is built from the parts other tests use: a real etcd (tests/etcd_server.py), two
controllers on it (tests/ha/cluster.py; fixed gRPC ports, so a killed one comes back where
clients look for it), and the demo's agents and trainers (fthsdp/demo/procs.py,
fthsdp/demo/trainer.py): one agent per replica host running its ranks, and a spare host
with warm standby trainers. Trainers record every step (tests/runtime/history_checks.py reads
the rows); the controllers' events are read from the leader's REST API as the run goes.

Faults are due at their step; the executor injects the next one only once every replica is
HEALTHY again and the previous fault is settled, and records what it did (`Injection`):
which replicas and hosts it touched, when, and when the job was whole again. Only
processes this run started are signalled, by PID. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from controller.settings import ControllerSettings
from fthsdp.demo import procs
from fthsdp.demo.data import prepare
from fthsdp.demo.run import RunSettings, load_rows
from protos import job_secret
from tests.chaos import composed, net_kinds
from tests.chaos.explain import TrainerError, trainer_errors
from tests.chaos.schedule import ChaosSettings, Fault, stop_past_the_timeouts
from tests.chaos.leadership import leadership_lines
from tests.etcd_server import EtcdServer
from tests.ha.cluster import JOB, ControllerProcess
from tests.ports import free_port
from tests.waiting import wait_until

POLL_S = 0.2
FAST_POLL_S = 0.01   # while waiting for a recovering replica's source to show (read from its records)


@dataclass
class Injection:
    """One fault as it was carried out."""
    kind: str
    scheduled: str                         # the schedule's description
    at: float                              # wall clock when it landed
    step: int                              # the job's step then
    replicas: list[str] = field(default_factory=list)  # replicas it touched
    hosts: list[str] = field(default_factory=list)     # hosts it killed
    detail: list[str] = field(default_factory=list)    # what was signalled, in words
    done_at: float | None = None           # its last action (SIGCONT, the controller back, the source killed)
    settled_at: float | None = None        # every replica HEALTHY again after it (None: never)
    hit_at: dict[str, float] = field(default_factory=dict)  # replica -> when it was hit (a source: later)
    controller_killed_at: float | None = None  # when it SIGKILLed (or cut off) the active controller
    controller: str = ""                   # ...and that controller's name
    quiet_after: float | None = None       # no death of what it touched may follow this (swap_then_kill_controller)
    observed: dict = field(default_factory=dict)  # what a fault that expects an answer saw (skewed_host: the agent's)


@dataclass
class Recorded:
    seed: int
    rows: list[dict]
    events: list[dict]                     # controller events: at, kind, subject, cause, message, seq
    injections: list[Injection]
    skipped: list[str]                     # faults that never found the job whole
    finished: bool                         # every trainer of every replica wrote its "done"
    started_at: float
    ended_at: float
    error: str = ""
    leadership: dict[str, list[dict]] = field(default_factory=dict)  # controller -> its leader events, from its log
    leftover: list[str] = field(default_factory=list)  # processes still running once the run stopped everything
    trainer_errors: list = field(default_factory=list)  # tests/chaos/explain.py TrainerError, from the agents' logs

    def to_json(self) -> dict:
        return {"seed": self.seed, "injections": [asdict(i) for i in self.injections], "skipped": self.skipped,
                "finished": self.finished, "error": self.error, "wall_s": round(self.ended_at - self.started_at, 2)}


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _last_action(inj: Injection) -> float:
    """When the fault last did something (its timeout counts from then): a later hit, its end."""
    return max(inj.at, *inj.hit_at.values(), inj.done_at or 0.0)


class PlacedController(ControllerProcess):
    """A controller that (re)starts inside `place()` (a network node's namespace, or here)."""
    place = staticmethod(contextlib.nullcontext)

    def start(self) -> "PlacedController":
        with self.place():
            return super().start()


class ChaosRun:
    """`net`: a started test network (tests/chaos/network.py) with nodes "etcd", "ca", "cb" and
    one per host (h0.., spare0..): each process starts in its node's namespace and listens on its
    address, and the run watches from the bridge's namespace; None: everything on loopback.
    `clock_skew_s`: host -> seconds its agent and trainers see their clock off by (libfaketime)."""

    def __init__(self, workdir: Path, settings: ChaosSettings, schedule: tuple[Fault, ...], seed: int = 0,
                 net=None, clock_skew_s: dict[str, float] | None = None) -> None:
        self.s, self.schedule, self.seed = settings.validate(), schedule, seed
        self.net = net
        self.clock_skew_s = dict(clock_skew_s or {})
        self.workdir = workdir
        self.records = workdir / "records"
        self.steps_file = workdir / "steps"
        self.controllers: list[ControllerProcess] = []
        self.agents: dict[str, subprocess.Popen] = {}
        self.events: dict[tuple, dict] = {}
        self._seen_seq: dict[str, int] = {}
        self._last_leader = ""
        self._agent_args: dict = {}
        self.view: dict = {}

    def _in(self, node: str):
        """Processes started (and sockets opened) in the block live on `node` of the network."""
        return self.net.entered(node) if self.net else contextlib.nullcontext()

    def _address(self, node: str) -> str:
        return self.net.node(node).address if self.net else "127.0.0.1"

    def _watching(self):
        """The run's own connections (REST polls) go out from the bridge's namespace."""
        return self.net.observer() if self.net else contextlib.nullcontext()

    # ------------------------------------------------------------------ set-up

    def _start(self, etcd: EtcdServer) -> None:
        s = self.s
        self.records.mkdir(parents=True)
        settings_file = self.workdir / "controller-settings.json"
        # The diagnosis acts here, as in production: its straggler findings need a rank slow in
        # 3 of 5 windows and over the last straggler_min_span_s (30 s here, not the default 5 s:
        # ChaosSettings says why); a healthy rank's scattered 1.1-1.9x windows on a loaded 2-core
        # machine name nobody, and the checkpoint writer's windows are marked disturbed. An
        # eviction of a healthy host would take the spare the schedule's host faults count on,
        # and the job could not end whole.
        settings_file.write_text(json.dumps({"rollback_wait_s": s.rollback_wait_s,
                                             "diagnosis": {"straggler_min_span_s": s.straggler_min_span_s}}))
        ports = [free_port() for _ in range(2)]
        # One secret per run: the controllers check every agent's and coordinator's proof with it
        # (a registration proof carries the agent's clock: skewed_host), the trainer ports too.
        secret = job_secret.generate()
        for i, name in enumerate("ab"):
            c = PlacedController(
                etcd.endpoint, replicas=s.replicas, lease_ttl_s=s.lease_ttl_s, name=name,
                heartbeat_timeout_s=s.heartbeat_timeout_s, log_path=self.workdir / f"controller-{name}.log",
                env=procs.environment(secret), extra=("--grpc-port", str(ports[i]), "--min-replicas", "1", "--join-timeout-s",
                       str(s.join_timeout_s), "--settings", str(settings_file), "--host", self._address(f"c{name}")))
            c.place = lambda node=f"c{name}": self._in(node)
            self.controllers.append(c.start())
        addresses = ",".join(f"{self._address(f'c{name}')}:{p}" for name, p in zip("ab", ports))
        hosts = [f"h{i}" for i in range(s.replicas)] + [f"spare{j}" for j in range(s.spares)]
        run = RunSettings(replicas=s.replicas, ranks_per_replica=s.ranks, steps=1, seed=self.seed,
                          lr_policy="sqrt", min_step_s=s.min_step_s, join_timeout_s=s.join_timeout_s,
                          heartbeat_timeout_s=s.heartbeat_timeout_s)
        cfg = run.trainer_config(prepare(self.workdir / "digits.npz", self.seed), self.records,
                                 {h: {"leader": free_port(), "gloo": free_port()} for h in hosts})
        cfg["timeouts"]["allreduce_s"] = s.allreduce_timeout_s
        cfg["bind_hosts"] = {h: self._address(h) for h in hosts}
        # The run decides when the job ends (steps_file), however long the faults keep it.
        cfg.update(job_id=JOB, ports_by="host", checkpoint_dir=str(self.workdir / "ckpt"),
                   checkpoint_every=s.checkpoint_every, steps_file=str(self.steps_file), max_steps=1 << 40)
        config = self.workdir / "trainer.json"
        config.write_text(json.dumps(cfg, indent=1))
        command = procs.TRAINER + [str(config)]
        budget = ("--standby-restart-budget", "50")  # every fault here is one the job must survive
        self._agent_args = dict(controller=addresses, job_id=JOB, command=command, secret=secret, extra=budget)
        for i, rid in enumerate(s.replica_ids):
            with self._in(f"h{i}"):
                self.agents[f"h{i}"] = procs.start_agent(
                    self.workdir / f"agent-h{i}.log", controller=addresses, host_id=f"h{i}", job_id=JOB,
                    command=command, replica_id=rid, ranks=s.ranks, secret=secret, extra=budget,
                    env=self._clock_of(f"h{i}"))
        for j in range(s.spares):
            with self._in(f"spare{j}"):
                self.agents[f"spare{j}"] = procs.start_agent(
                    self.workdir / f"agent-spare{j}.log", controller=addresses, host_id=f"spare{j}", job_id=JOB,
                    command=command, ranks=s.ranks, spare=True, standby=True, secret=secret,
                    extra=budget, env=self._clock_of(f"spare{j}"))
        for host, agent in self.agents.items():
            procs.read_json_line(agent, 60.0, f"agent {host} (log {self.workdir / f'agent-{host}.log'})")

    def start_spare_agent(self, host: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Agent `host` joins the running job as a spare (no standby trainers), started in its node
        as the job's own agents were; the run stops it at its end if nothing did before."""
        with self._in(host):
            agent = procs.start_agent(log, host_id=host, ranks=self.s.ranks, spare=True, env=env, **self._agent_args)
        self.agents[host] = agent
        return agent

    def _clock_of(self, host: str) -> dict[str, str] | None:
        if host not in self.clock_skew_s:
            return None
        from tests.chaos.net_faults import skewed_clock
        return skewed_clock(self.clock_skew_s[host])

    def run(self) -> Recorded:
        self.workdir.mkdir(parents=True, exist_ok=True)
        started = time.time()
        with self._in("etcd"):
            etcd = EtcdServer.start_new(host=self._address("etcd"))
        injections: list[Injection] = []
        skipped: list[str] = []
        error = ""
        try:
            self._start(etcd)
            with self._watching():
                self._follow(injections, skipped)
        except Exception as exc:  # noqa: BLE001 - a broken run is a finding: reported, processes still stopped
            error = f"{type(exc).__name__}: {exc}"
        finally:
            if self.net is not None:
                try:
                    self.net.faults.heal_all()
                except Exception as exc:  # noqa: BLE001 - reported; the processes must still be stopped
                    error = error or f"healing the network failed: {type(exc).__name__}: {exc}"
            finished = self._done()
            try:
                with self._watching():
                    self._poll_events()
            except Exception:  # noqa: BLE001 - no leader at the very end: the events seen so far stand
                pass
            self._stop(etcd)
            leftover = self._leftover()
        return Recorded(self.seed, load_rows(self.records), sorted(self.events.values(), key=lambda e: e["at"]),
                        injections, skipped, finished, started, time.time(), error,
                        {c.name: leadership_lines(c.log_path) for c in self.controllers}, leftover,
                        self._trainer_errors())

    def _trainer_errors(self) -> list[TrainerError]:
        """Every trainer traceback in the agents' logs (each agent copies its trainers' stderr)."""
        found = []
        for log in sorted(self.workdir.glob("agent-*.log")):
            found += trainer_errors(log.read_text(errors="replace"), log.stem.removeprefix("agent-"))
        return sorted(found, key=lambda e: e.at or 0.0)

    def _leftover(self) -> list[str]:
        """On a network: the processes still in its namespaces once everything was stopped
        (a SIGKILLed trainer is gone once reaped: waited for, bounded)."""
        if self.net is None:
            return []
        try:
            wait_until(lambda: not self.net.pids(), 10.0, "every process of the run to end", every_s=0.1)
        except AssertionError:
            return [f"pid {pid} on {node}" for node, pids in self.net.pids().items() for pid in pids]
        return []

    def _stop(self, etcd: EtcdServer) -> None:
        trainers = [pid for agent in self.agents.values() if agent.poll() is None
                    for pid in procs.descendants(agent.pid)]
        for pid in trainers:  # a trainer stopped by a fault that ended early must be able to exit
            _signal(pid, signal.SIGCONT)
        for agent in self.agents.values():
            procs.stop(agent, 10.0)
        for pid in trainers:
            _signal(pid, signal.SIGKILL)
        for c in self.controllers:
            c.stop()
        etcd.close()

    # ------------------------------------------------------------------ watching the job

    def _done(self) -> bool:
        return all((self.records / f"{r}-{k}.done").exists() for r in self.s.replica_ids for k in range(self.s.ranks))

    def _leader(self) -> tuple[ControllerProcess, dict] | tuple[None, None]:
        """The leading controller and its job view (the last leader is asked first)."""
        for c in sorted(self.controllers, key=lambda c: c.http != self._last_leader):
            if c.proc is None or c.proc.poll() is not None:
                continue
            try:
                job = httpx.get(f"{c.http}/api/v1/job", timeout=5.0).json()
            except (httpx.HTTPError, ValueError):
                continue
            if job.get("this_controller_leads"):
                self._last_leader = c.http
                return c, job
        return None, None

    def _refresh(self) -> bool:
        """The leading controller's view of the job; False when no controller leads now."""
        leader, job = self._leader()
        if leader is None:
            return False
        try:
            with httpx.Client(base_url=leader.http, timeout=5.0) as http:
                self.view = {"job": job,
                             "replicas": {r["replica_id"]: r for r in http.get("/api/v1/replicas").json()},
                             "hosts": http.get("/api/v1/hosts").json()}
                self._poll_events(leader, http)
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return True

    def _poll_events(self, leader: ControllerProcess | None = None, http: httpx.Client | None = None) -> None:
        """New events from the leader (each leader paged from its own start: seqs may repeat after a takeover)."""
        leader = leader or self._leader()[0]
        if leader is None:
            return
        own = http or httpx.Client(base_url=leader.http, timeout=5.0)
        try:
            while True:
                after = self._seen_seq.get(leader.http, -1)
                page = own.get("/api/v1/events", params={"after": after, "limit": 1000}).json()
                for e in page:
                    self.events.setdefault((e["seq"], e["kind"], e["subject"], e["message"]), e)
                if not page:
                    return
                self._seen_seq[leader.http] = page[-1]["seq"]
        finally:
            if http is None:
                own.close()

    def _all_healthy(self) -> bool:
        replicas = self.view.get("replicas", {})
        return len(replicas) == self.s.replicas and all(r["state"] == "HEALTHY" for r in replicas.values())

    def _settled(self, inj: Injection) -> bool:
        """Every replica is HEALTHY, and each one the fault touched died and became HEALTHY after it
        (a controller kill: another controller took over)."""
        if inj.done_at is None or not self._all_healthy():
            return False
        events = list(self.events.values())
        if inj.controller_killed_at is not None and not any(
                e["kind"] == "leader" and e["at"] >= inj.controller_killed_at for e in events):
            return False
        return all(self._settled_replica(inj, rid) for rid in inj.replicas)

    def _settled_replica(self, inj: Injection, rid: str) -> bool:
        """`rid`, which `inj` touched, died and became HEALTHY after it."""
        events = list(self.events.values())
        deaths = [e["at"] for e in events if e["kind"] == "death" and e["subject"] == rid and e["at"] >= inj.at - 1]
        return bool(deaths) and any(e["kind"] == "replica" and e["subject"] == rid and "became HEALTHY" in e["message"]
                                    and e["at"] >= min(deaths) for e in events)

    def _end_at(self, step: int) -> None:
        tmp = self.steps_file.with_name(".steps.tmp")
        tmp.write_text(str(step))
        os.replace(tmp, self.steps_file)

    def _follow(self, injections: list[Injection], skipped: list[str]) -> None:
        """Inject each fault once its step is due and the job is whole, carry out its follow-up
        actions, note when it settled; then let the job end."""
        pending = list(self.schedule)
        active: Injection | None = None
        action = None
        due = self.s.first_fault_step
        ending = fast = False

        def tick() -> bool:
            """One look at the job: follow up, settle, inject or end; True once it finished."""
            nonlocal pending, active, action, due, ending, fast
            if fast and action is not None:  # a follow-up watching closely: nothing else meanwhile
                action, fast = action(time.time())
                if action is None:
                    active.done_at = time.time()
                return self._done()
            fast = False
            if self._refresh():
                now, step = time.time(), self.view["job"]["max_step"]
                if active is not None and action is not None:
                    action, fast = action(now)
                    if action is None:
                        active.done_at = now
                if active is not None and active.done_at is not None and self._settled(active):
                    active.settled_at, active = now, None
                    due = step + self.s.gap_steps
                elif active is not None and now > _last_action(active) + self.s.fault_timeout_s:
                    active = action = None  # never settled: the checks say so; no more faults
                    skipped.extend(f.describe() for f in pending)
                    pending = []
                if active is None and pending and step >= due and self._all_healthy():
                    fault = pending.pop(0)
                    active = Injection(fault.kind, fault.describe(), time.time(), step)
                    action = self._inject(fault, active)
                    if action is None:
                        active.done_at = active.at
                    injections.append(active)
                if active is None and not pending and not ending:
                    self._end_at(max(step, due) + self.s.tail_steps)
                    ending = True
            return self._done()

        if not self._done():
            wait_until(tick, self.s.run_timeout_s, f"the job to finish; logs in {self.workdir}",
                       every_s=lambda: FAST_POLL_S if fast else POLL_S)

    # ------------------------------------------------------------------ faults

    def _pid(self, rid: str, rank: int) -> int:
        path = self.records / f"{rid}-{rank}.pid"
        pid = int(path.read_text()) if path.exists() else 0
        if not pid or not procs.alive(pid):
            raise RuntimeError(f"no live trainer for {rid} rank {rank} (pid file {path})")
        return pid

    def _kill(self, inj: Injection, rid: str, rank: int) -> None:
        pid = self._pid(rid, rank)
        _signal(pid, signal.SIGKILL)
        inj.detail.append(f"SIGKILL {rid} rank {rank} (pid {pid})")
        self._touch(inj, rid)

    @staticmethod
    def _touch(inj: Injection, rid: str) -> None:
        if rid not in inj.replicas:
            inj.replicas.append(rid)
            inj.hit_at[rid] = time.time()

    def _host_of(self, rid: str) -> str:
        return next(h["host_id"] for h in self.view["hosts"] if h["state"] == "ACTIVE" and h["assignment"]
                    and h["assignment"]["replica_id"] == rid)

    def _inject(self, f: Fault, inj: Injection):
        """Carry out the first action of `f`; returns the follow-up (now -> (next or None, poll fast)) or None."""
        if f.kind in ("kill_leader", "kill_rank"):
            self._kill(inj, f.replicas[0], f.rank)
        elif f.kind == "double_kill":
            for rid in f.replicas:
                self._kill(inj, rid, 0)
        elif f.kind == "kill_host":
            composed.kill_host(self, inj, f.replicas[0])
        elif f.kind == "stop_replica":
            rid = f.replicas[0]
            pids = [self._pid(rid, k) for k in range(self.s.ranks)]
            for pid in pids:
                _signal(pid, signal.SIGSTOP)
            self._touch(inj, rid)
            stop_s = self._past_the_timeouts(f.stop_s, inj.at)
            inj.detail.append(f"SIGSTOP {rid}'s trainers {pids} for {stop_s:g}s" + (
                f" (not {f.stop_s:g}s: a takeover's grace forgives silence until "
                f"{stop_s - f.stop_s + self.s.heartbeat_timeout_s:.1f}s from now)" if stop_s > f.stop_s else ""))

            def resume(now: float):
                if now < inj.at + stop_s:
                    return resume, False
                for pid in pids:
                    _signal(pid, signal.SIGCONT)
                inj.detail.append(f"SIGCONT {pids}")
                return None, False
            return resume
        elif f.kind == "kill_source":
            return self._kill_source(f, inj)
        elif f.kind == "kill_controller":
            return composed.kill_active_controller(self, inj, f.down_s)
        elif f.kind in ("swap_then_kill_controller", "kill_controller_catching_up", "kill_host_in_grace"):
            return getattr(composed, f.kind)(self, f, inj)
        elif f.kind in net_kinds.KINDS:
            return net_kinds.inject(self, f, inj)
        else:
            raise ValueError(f"unknown fault kind {f.kind!r}")
        return None

    def _rows_of(self, rid: str, rank: int, not_pid: int) -> list[dict]:
        """What the current trainer of `rid` rank `rank` recorded, unless it is still pid `not_pid`."""
        path = self.records / f"{rid}-{rank}.pid"
        pid = int(path.read_text()) if path.exists() else not_pid
        rows = self.records / f"{rid}-{rank}-{pid}.jsonl"
        if pid == not_pid or not rows.exists():
            return []
        out = []
        for line in rows.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # being written
                break
        return out

    def _past_the_timeouts(self, stop_s: float, now: float) -> float:
        grace = ControllerSettings(heartbeat_timeout_s=self.s.heartbeat_timeout_s).takeover_grace_s
        takeovers = [e["at"] for e in self.events.values() if e["kind"] == "grace"]
        return stop_past_the_timeouts(stop_s, now, max(takeovers, default=None), grace, self.s.heartbeat_timeout_s)

    def _kill_source(self, f: Fault, inj: Injection):
        """Kill the replica's leader; when its restarted rank `f.rank` starts catching up (its
        trainer records the source it fetches from before its step's all-reduce), kill that
        source's rank `f.rank`: the catch-up loses its source mid-step."""
        rid = f.replicas[0]
        killed = {k: self._pid(rid, k) for k in range(self.s.ranks)}
        self._kill(inj, rid, 0)

        def source(now: float):  # polled closely: the catch-up step takes about min_step_s
            catching_up, committed = self._catch_up(rid, f.rank, killed[f.rank])
            if catching_up is not None:
                src = catching_up["source"]
                try:
                    self._kill(inj, src, f.rank)
                    inj.detail[-1] += (f", the source of {rid}'s rank {f.rank} catching up at step "
                                       f"{catching_up['step']}")
                except RuntimeError as exc:
                    inj.detail.append(f"the source {src} of {rid} had no live rank {f.rank}: {exc}")
                return None, False
            if committed:
                inj.detail.append(f"{rid} rank {f.rank} committed without catching up first")
                return None, False
            return source, True
        return source

    def _catch_up(self, rid: str, rank: int, killed_pid: int) -> tuple[dict | None, bool]:
        """What the trainer that replaced pid `killed_pid` as `rid` rank `rank` recorded so far:
        its "catching_up" row (or None), and whether it committed a step."""
        rows = self._rows_of(rid, rank, killed_pid)
        return (next((r for r in rows if r.get("event") == "catching_up"), None),
                any(r.get("event") == "commit" for r in rows))
