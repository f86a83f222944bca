"""Run one demo job: controller, agents (or direct trainers for the baseline), failures on
schedule, live progress; returns what happened for `report.build`.

Waits are bounded and event-driven where a file or process tells us (marker files,
process exits); the controller's REST API is polled for the status table and triggers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fthsdp.demo import procs
from fthsdp.demo.schedule import DIAGNOSED, Failure, moment, placement, replica_ids, steps_per_sync
from fthsdp.status import render
from protos import job_secret
from protos.local_ports import listen_port
from protos import timeout_rules as tr

log = logging.getLogger("fthsdp.demo")
JOB_ID = "demo"
POLL_S = 0.25
LATE_MARGIN_STEPS = 3  # no failure is injected this close to the last step


@dataclass(frozen=True)
class RunSettings:
    replicas: int
    ranks_per_replica: int
    steps: int
    seed: int
    lr_policy: str
    spares: int = 1
    standby: bool = True
    warm_restarts: bool = False  # every agent keeps a reserve standby next to each trainer
    model: str = "mlp"   # or "gpt" (fthsdp/demo/workloads.py)
    hidden: int = 32
    batch_rows: int = 32
    lr: float = 0.05
    min_step_s: float = 0.1
    join_timeout_s: float = 1.0
    heartbeat_timeout_s: float = 3.0
    timeout_s: float = 150.0
    diagnosis_dry_run: bool = False
    #: False: the controller's own diagnosis defaults instead of the demo's quick DIAGNOSIS
    demo_diagnosis: bool = True
    #: how replicas meet (protos/sync_modes.py); `steps` counts syncs of `steps_per_sync` training steps
    sync_mode: str = "sync"
    sync_every: int = 1                  # H: training steps between two syncs of the same parameters
    outer_lr: float | None = None        # diloco's outer optimizer; None: the runtime's default
    outer_momentum: float | None = None
    sync_fragments: int = 1              # streaming_diloco

    @property
    def semi_synchronous(self) -> bool:
        return self.sync_mode != "sync"

    @property
    def steps_per_sync(self) -> int:
        """K, the training steps of one protocol step (a sync): H, or with streaming_diloco's F
        fragments H / F (one fragment's sync every K training steps, each fragment every H;
        RuntimeSettings.inner_steps_per_sync). Failures are placed and syncs counted in K."""
        return steps_per_sync(self.sync_every, self.sync_fragments)

    def describe_steps(self) -> str:
        if not self.semi_synchronous:
            return f"{self.steps} steps"
        k = self.steps_per_sync
        return f"{self.steps} syncs of {k} training steps ({self.steps * k} steps)"

    def describe_mode(self) -> str:
        if not self.semi_synchronous:
            return "sync (gradients averaged every step)"
        text = f"{self.sync_mode}, a sync every {self.sync_every} training steps"
        if self.sync_fragments > 1:
            text = (f"{self.sync_mode}, {self.sync_fragments} fragments each synced every {self.sync_every} "
                    f"training steps (a sync of one fragment every {self.steps_per_sync})")
        if "diloco" in self.sync_mode:
            from fthsdp.settings import RuntimeSettings

            lr = RuntimeSettings.outer_lr if self.outer_lr is None else self.outer_lr
            momentum = RuntimeSettings.outer_momentum if self.outer_momentum is None else self.outer_momentum
            text += f" (outer Nesterov SGD, lr {lr:g}, momentum {momentum:g})"
        return text

    def sync_view(self) -> dict:
        """The mode as the report names it."""
        return {"mode": self.sync_mode, "every_steps": self.sync_every, "outer_lr": self.outer_lr,
                "outer_momentum": self.outer_momentum, "fragments": self.sync_fragments,
                "steps_per_sync": self.steps_per_sync, "text": self.describe_mode()}

    def controller_flags(self) -> tuple[str, ...]:
        """The controller's flags for the mode (it must agree with the trainers' environment,
        `sync_environment`, or every trainer is refused); none for the default mode."""
        if not self.semi_synchronous:
            return ()
        return ("--sync-mode", self.sync_mode, "--sync-every", str(self.sync_every),
                "--sync-fragments", str(self.sync_fragments))

    def sync_environment(self) -> dict[str, str]:
        """What every trainer of the run gets in its environment: the runtime reads its mode there
        (RuntimeSettings.from_env), as a user's script does; nothing for the default mode."""
        from fthsdp import settings as rs

        if not self.semi_synchronous:
            return {}
        env = {rs.ENV_SYNC_MODE: self.sync_mode, rs.ENV_SYNC_EVERY_STEPS: str(self.sync_every)}
        if self.outer_lr is not None:
            env[rs.ENV_OUTER_LR] = repr(self.outer_lr)
        if self.outer_momentum is not None:
            env[rs.ENV_OUTER_MOMENTUM] = repr(self.outer_momentum)
        if self.sync_fragments > 1:
            env[rs.ENV_SYNC_FRAGMENTS] = str(self.sync_fragments)
        return env

    def trainer_config(self, data: Path, records: Path, ports: dict, faults: list[dict] = ()) -> dict:
        return {"job_id": JOB_ID, "model": self.model, "data": str(data), "records": str(records),
                "replicas": replica_ids(self.replicas),
                "steps": self.steps, "max_steps": self.steps * 3 + 50, "seed": self.seed, "hidden": self.hidden,
                "batch_rows": self.batch_rows, "lr": self.lr, "ports": ports, "min_step_s": self.min_step_s,
                "timeouts": {**TRAINER_TIMEOUTS, "controller_heartbeat_s": self.heartbeat_timeout_s},
                "digest_every_steps": 1, "faults": list(faults)}

    def timeout_values(self) -> dict[str, float]:
        """The whole configuration's timeouts (controller, agents, trainers), qualified as
        protos/timeout_rules.py names them: the demo starts all three, so it checks every rule."""
        from agent.settings import AgentSettings
        from controller.core.diagnosis.settings import DiagnosisSettings
        from controller.settings import ControllerSettings
        from fthsdp.settings import RuntimeSettings

        t = TRAINER_TIMEOUTS
        controller = ControllerSettings(join_timeout_s=self.join_timeout_s, heartbeat_timeout_s=self.heartbeat_timeout_s,
                                        diagnosis=DiagnosisSettings(**DIAGNOSIS if self.demo_diagnosis else {}))
        agent = AgentSettings(controller_addresses=("-",), host_id="-", command=("-",), **procs.AGENT_TIMEOUTS)
        runtime = RuntimeSettings(quorum_timeout_s=t["quorum_s"], allreduce_timeout_s=t["allreduce_s"],
                                  gather_timeout_s=t["vote_s"], fetch_timeout_s=t["fetch_s"],
                                  fetch_hold_timeout_s=t["fetch_hold_s"], heartbeat_interval_s=t["heartbeat_s"],
                                  controller_heartbeat_timeout_s=self.heartbeat_timeout_s)
        return {**tr.qualified(tr.CONTROLLER, controller.timeout_values()),
                **tr.qualified(tr.AGENT, agent.timeout_values()), **tr.qualified(tr.RUNTIME, runtime.timeout_values())}


#: The trainers' timeouts in the demo (a step is 0.1-0.5 s here).
TRAINER_TIMEOUTS = {"quorum_s": 30.0, "allreduce_s": 5.0, "vote_s": 10.0, "fetch_s": 10.0, "fetch_hold_s": 5.0,
                    "heartbeat_s": 0.5}


#: The controller's diagnosis in the demo: quick to act (a step is 0.1-0.5 s here), below the
#: trainers' own timeouts (FTAR 5 s, gather 10 s) so it sees a stuck collective before they give up.
#: A hung rank costs its replica about hang_after_s + one analysis interval + two steps (the
#: spare's catch-up step, then its first trained one); the survivors about hang_after_s and a
#: step: 2 s is still 4 of bench.recovery's 0.5 s steps and 20 of the demo's 0.1 s ones, and a
#: slow host (3x) adds two steps at most.
DIAGNOSIS = {"hang_after_s": 2.0, "startup_grace_s": 20.0, "analysis_interval_s": 0.25, "telemetry_stale_s": 5.0,
             "straggler_window_wait_s": 5.0, "sdc_evict_after": 2, "max_evictions_per_hour": 10}
#: How much slower a `slow` host is.
SLOW_FACTOR = 3.0


def host_of(replica: str, replicas: list[str]) -> str:
    """The host that runs `replica` when the job starts (agents are named after replicas)."""
    return f"h{replicas.index(replica)}"


def fault_specs(failures: list[Failure], s: RunSettings, records: Path) -> list[dict]:
    """What each trainer needs to know to go bad: on which host and rank, how, and the file
    whose appearance lets it loose. Semi-synchronous, a kill placed in a sync: the replica's
    rank 0 holds at the start of its next sync's all-reduce once the file exists, and says so,
    so that the kill lands there (`hold_in_sync`)."""
    ids = replica_ids(s.replicas)
    specs = [{"kind": f.kind, "host": host_of(f.replica, ids), "rank": s.ranks_per_replica - 1,
              "go": str(records / f"fault-{f.replica}.go"), "extra_s": (SLOW_FACTOR - 1) * s.min_step_s}
             for f in failures if f.kind in DIAGNOSED]
    specs += [{"kind": HOLD_IN_SYNC, "host": host_of(f.replica, ids), "rank": 0,
               "go": str(_hold_file(records, f, "go")), "held": str(_hold_file(records, f, "held")),
               "hold_s": TRAINER_TIMEOUTS["allreduce_s"]}
              for f in failures if _in_sync(f, s)]
    return specs


#: the fault spec of a kill placed in a sync (fthsdp/demo/faults.py HoldsInSync)
HOLD_IN_SYNC = "hold-in-sync"


def _in_sync(f: Failure, s: RunSettings) -> bool:
    return s.semi_synchronous and f.kind not in DIAGNOSED and placement(f.at_step, s.steps_per_sync)[1] == 0


def _due(f: Failure, s: RunSettings) -> int:
    """The job's step from which `f` is injected: a kill placed in sync n is armed a sync before."""
    sync, inner = placement(f.at_step, s.steps_per_sync)
    return max(sync - 1, 0) if _in_sync(f, s) else sync


def _hold_file(records: Path, f: Failure, suffix: str) -> Path:
    return records / f"sync-{f.at_step}-{f.replica}.{suffix}"


@dataclass
class RunResult:
    rows: list[dict]                                          # every trainer record
    events: list[dict] = field(default_factory=list)          # controller events (wall clock)
    samples: list[tuple[float, int]] = field(default_factory=list)  # (time, healthy replicas)
    injections: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # failures that found no time left
    diagnoses: list[dict] = field(default_factory=list)  # the controller's findings, newest first
    started_at: float = 0.0
    ended_at: float = 0.0
    error: str = ""


def _ports(owners: list[str]) -> dict:
    """Each owner's coordinator and gloo ports, bound by its trainers later (protos/local_ports.py)."""
    return {o: {"leader": listen_port(), "gloo": listen_port()} for o in owners}


def host_ids(s: RunSettings) -> list[str]:
    """The faulty run's agents: one host per replica, then the spares."""
    return [f"h{i}" for i in range(s.replicas)] + [f"spare{j}" for j in range(s.spares)]


def _prepare(workdir: Path, s: RunSettings, data: Path, failures: list[Failure] = (),
             by_host: bool = False) -> tuple[Path, Path]:
    """Records folder and trainer config. `by_host`: the coordinator and gloo ports are each
    host's, as on separate machines: a spare that takes a replica binds its own at once instead
    of waiting until the replaced host's trainers (a hung one too) have stopped and freed them."""
    if workdir.exists():
        shutil.rmtree(workdir)
    records = workdir / "records"
    records.mkdir(parents=True)
    config = workdir / "trainer.json"
    cfg = s.trainer_config(data, records, _ports(host_ids(s) if by_host else replica_ids(s.replicas)),
                           fault_specs(list(failures), s, records))
    if by_host:
        cfg["ports_by"] = "host"
    config.write_text(json.dumps(cfg, indent=1))
    return records, config


def _controller(workdir: Path, s: RunSettings, secret: str) -> procs.ControllerProcess:
    settings = workdir / "controller.json"
    diagnosis = DIAGNOSIS if s.demo_diagnosis else {}
    settings.write_text(json.dumps({"diagnosis": {**diagnosis, "dry_run": s.diagnosis_dry_run}}))
    return procs.start_controller(workdir / "controller.log", job_id=JOB_ID, replicas=s.replicas,
                                  join_timeout_s=s.join_timeout_s, heartbeat_timeout_s=s.heartbeat_timeout_s,
                                  lr_policy=s.lr_policy, settings=settings, secret=secret,
                                  sync_flags=s.controller_flags())


def _done(records: Path, s: RunSettings) -> bool:
    return all((records / f"{r}-{k}.done").exists() for r in replica_ids(s.replicas)
               for k in range(s.ranks_per_replica))


def load_rows(records: Path) -> list[dict]:
    rows = []
    for path in sorted(records.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a trainer killed mid-line
                continue
    return sorted(rows, key=lambda r: r["t"])


class Progress:
    """On a terminal, the status table updated in place (rich's Live display: the cursor moves
    back over the last frame, the screen is never cleared); otherwise plain progress lines.
    `console` is where the live view draws (stdout unless given)."""

    def __init__(self, http: httpx.Client, steps: int, tty: bool, console=None) -> None:
        self.http, self.steps, self.tty = http, steps, tty
        self.notes: list[str] = []
        self._last_line = ""
        self._last_at = 0.0
        self._live = None
        if tty:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=console or Console(), auto_refresh=False, redirect_stdout=False)
            self._live.start()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def note(self, text: str) -> None:
        self.notes.append(text)
        if self._live is not None:
            self._live.console.print(f"demo: {text}")  # above the live table, which stays in place
        else:
            print(f"demo: {text}", flush=True)

    def show(self, job: dict, replicas: list, now: float) -> None:
        if self._live is not None:
            from rich.text import Text

            parts = {"job": job, "replicas": replicas}
            for name, path in (("hosts", "/api/v1/hosts"), ("quorums", "/api/v1/quorums"),
                               ("events", "/api/v1/events?limit=6")):
                parts[name] = self.http.get(path).json()
            self._live.update(Text(f"{render(**parts)}\n\ndemo: step {job['max_step']} of {self.steps}"),
                              refresh=True)
            return
        line = (f"step {job['max_step']}/{self.steps}  healthy {job['replicas_healthy']}/{job['replicas_total']}  "
                f"behind {job['replicas_behind']}  dead {job['replicas_dead']}  quorum {job['quorum_id']}  "
                f"spares free {job['spares_free']}")
        if line != self._last_line and now - self._last_at >= 2.0:
            print(f"demo: {line}", flush=True)
            self._last_line, self._last_at = line, now


#: how often the demo looks for the moment a semi-synchronous failure is placed at
MOMENT_POLL_S = 0.005


def _last_trained(records: Path, replica: str) -> dict | None:
    """The newest "trained" row of the replica's rank 0 (its current process), or None."""
    try:
        pid = int((records / f"{replica}-0.pid").read_text())
        with open(records / f"{replica}-0-{pid}.jsonl", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except (OSError, ValueError):
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # being written, or cut by the tail's start
            continue
        if row.get("event") == "trained":
            return row
    return None


def await_moment(f: Failure, s: RunSettings, records: Path) -> bool:
    """Semi-synchronous: wait (bounded: about two rounds) until the replica is where `f` is placed
    (schedule.placement): training inner step k of a round ending at or after its sync (read from
    its rank 0's records), or held at the start of a sync's all-reduce (fault_specs). False when
    the moment did not come in time (the caller tries again later)."""
    sync, inner = placement(f.at_step, s.steps_per_sync)
    go, held = _hold_file(records, f, "go"), _hold_file(records, f, "held")
    if not inner and not go.exists():  # the replica holds (once) in the first sync from `sync` on, writes `held`
        go.write_text(str(sync))
    deadline = time.monotonic() + 2 * s.steps_per_sync * max(s.min_step_s, 0.05) + 10.0
    while time.monotonic() < deadline:
        if not inner and held.exists():
            return True
        row = _last_trained(records, f.replica) if inner else None
        if row is not None and row["step"] >= sync and row.get("inner") == inner:
            return True
        time.sleep(MOMENT_POLL_S)
    return False


def _inject(f: Failure, job: dict, replicas: dict, hosts: list, agents: dict, records: Path,
            configured: list[str], s: RunSettings) -> dict | None:
    """Inject `f` once every configured replica is HEALTHY (failures never overlap, so some
    replica always holds the live state; one that has not registered yet counts as not
    healthy) and, semi-synchronous, at its moment (`await_moment`); the injection record, or
    None to try again later."""
    if any(replicas.get(rid, {}).get("state") != "HEALTHY" for rid in configured):
        return None
    placed = s.semi_synchronous and f.kind not in DIAGNOSED
    if placed and not await_moment(f, s, records):
        return None
    record = _kill(f, job, hosts, agents, records, configured)
    if record is not None and placed:
        record.update(training_step=f.at_step, moment=moment(f.at_step, s.steps_per_sync),
                      injected_sync=placement(f.at_step, s.steps_per_sync)[0])
    return record


def _kill(f: Failure, job: dict, hosts: list, agents: dict, records: Path, configured: list[str]) -> dict | None:
    """Make `f` happen now; the injection record (with the pid of the replica's rank 0 then), or
    None when its target is not there yet."""
    pid_file = records / f"{f.replica}-0.pid"
    leader = int(pid_file.read_text()) if pid_file.exists() else 0
    if f.kind in DIAGNOSED:  # the trainer on that host goes bad once this file exists
        (records / f"fault-{f.replica}.go").write_text(str(job["max_step"]))
        host = host_of(f.replica, configured)
        return {"kind": f.kind, "replica": f.replica, "scheduled_step": f.at_step, "injected_step": job["max_step"],
                "injected_at": time.time(), "target": f"host {host} ({f.kind})", "host": host}
    if f.kind in ("kill-trainer", "hang-trainer"):
        rank = 0 if f.kind == "kill-trainer" else max(len(list(records.glob(f"{f.replica}-*.pid"))) - 1, 0)
        pid_file = records / f"{f.replica}-{rank}.pid"
        pid = int(pid_file.read_text()) if pid_file.exists() else 0
        if not pid or not procs.alive(pid):
            return None
        os.kill(pid, signal.SIGKILL if f.kind == "kill-trainer" else signal.SIGSTOP)
        target = f"trainer pid {pid} (rank {rank})"
    else:
        host = next((h["host_id"] for h in hosts if h["assignment"] and h["state"] == "ACTIVE"
                     and h["assignment"]["replica_id"] == f.replica), None)
        if host is None or host not in agents:
            return None
        under = procs.kill_host(agents.pop(host))
        target = f"host {host} (agent and {len(under)} trainer process(es))"
    return {"kind": f.kind, "replica": f.replica, "scheduled_step": f.at_step, "injected_step": job["max_step"],
            "injected_at": time.time(), "target": target, "pid": leader,
            "signal": "SIGSTOP" if f.kind == "hang-trainer" else "SIGKILL"}


def _with_controller(workdir: Path, s: RunSettings, records: Path, body, secret: str) -> RunResult:
    """Start the controller, run `body(controller, result, children)`, then stop every child
    process it started and the controller (whatever happened), and collect the records."""
    result = RunResult([], started_at=time.time())
    try:
        controller = _controller(workdir, s, secret)
    except (RuntimeError, OSError) as exc:
        return RunResult([], error=str(exc), started_at=result.started_at, ended_at=time.time())
    children: list[subprocess.Popen] = []
    try:
        body(controller, result, children)
    except Exception as exc:  # noqa: BLE001 - reported, and the processes still stopped
        result.error = str(exc)
    finally:
        for child in children:
            procs.stop(child, 10.0)
        procs.stop(controller.proc, 10.0)
    result.ended_at = time.time()
    result.rows = load_rows(records)
    return result


def run_job(workdir: Path, data: Path, s: RunSettings, failures: list[Failure], *, tty: bool) -> RunResult:
    """The faulty run: embedded controller, one agent per replica plus spares, failures on schedule."""
    records, config = _prepare(workdir, s, data, failures, by_host=True)
    command = procs.TRAINER + [str(config)]
    secret = job_secret.generate()  # one per run: the trainer ports authenticate with it
    warm = ("--warm-restarts",) if s.warm_restarts else ()

    def body(controller, result: RunResult, children: list) -> None:
        agents: dict[str, subprocess.Popen] = {}
        for i, rid in enumerate(replica_ids(s.replicas)):
            agents[f"h{i}"] = procs.start_agent(workdir / f"agent-h{i}.log", controller=controller.grpc,
                                                host_id=f"h{i}", job_id=JOB_ID, command=command, replica_id=rid,
                                                ranks=s.ranks_per_replica, secret=secret, extra=warm,
                                                env=s.sync_environment())
            children.append(agents[f"h{i}"])
        for j in range(s.spares):
            agents[f"spare{j}"] = procs.start_agent(workdir / f"agent-spare{j}.log", controller=controller.grpc,
                                                    host_id=f"spare{j}", job_id=JOB_ID, command=command,
                                                    ranks=s.ranks_per_replica, spare=True, standby=s.standby,
                                                    secret=secret, extra=warm, env=s.sync_environment())
            children.append(agents[f"spare{j}"])
        for host, agent in agents.items():
            procs.read_json_line(agent, 60.0, f"agent {host} (log {workdir / f'agent-{host}.log'})")
        with httpx.Client(base_url=controller.http, timeout=5.0) as http:
            try:
                _watch(http, s, failures, agents, records, result, tty)
            finally:  # what happened, also when the run did not finish
                result.events = http.get("/api/v1/events", params={"limit": 100_000}).json()
                result.diagnoses = http.get("/api/v1/diagnoses", params={"limit": 500}).json()["findings"]

    return _with_controller(workdir, s, records, body, secret)


def _watch(http: httpx.Client, s: RunSettings, failures: list[Failure], agents: dict, records: Path,
           result: RunResult, tty: bool) -> None:
    progress = Progress(http, s.steps, tty)
    try:
        _follow(http, s, failures, agents, records, result, progress)
    finally:
        progress.close()


def _follow(http: httpx.Client, s: RunSettings, failures: list[Failure], agents: dict, records: Path,
            result: RunResult, progress: Progress) -> None:
    pending = list(failures)
    deadline = time.monotonic() + s.timeout_s
    while not _done(records, s):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the job did not finish within {s.timeout_s:g}s; logs in {records.parent}")
        job = http.get("/api/v1/job").json()
        replicas = http.get("/api/v1/replicas").json()
        now = time.time()
        result.samples.append((now, sum(r["state"] == "HEALTHY" for r in replicas)))
        if pending and job["max_step"] >= s.steps - (1 if s.semi_synchronous else LATE_MARGIN_STEPS):
            # Too close to the end: the survivors would finish and leave nobody to rejoin.
            late = pending.pop(0)
            result.skipped.append(late.describe())
            progress.note(f"step {job['max_step']}: skipped {late.describe()}: the job is within "
                          f"{LATE_MARGIN_STEPS} steps of its end (failures wait until every replica is HEALTHY)")
        elif pending and job["max_step"] >= _due(pending[0], s):
            hosts = http.get("/api/v1/hosts").json()
            done = _inject(pending[0], job, {r["replica_id"]: r for r in replicas}, hosts, agents, records,
                           replica_ids(s.replicas), s)
            if done is not None:
                pending.pop(0)
                done["after_s"] = round(done["injected_at"] - result.started_at, 3)
                result.injections.append(done)
                what = (f"{done['target']} goes bad" if done["kind"] in DIAGNOSED
                        else f"{done['signal']} {done['target']}")
                progress.note(f"step {done['injected_step']}: {done['kind']} {done['replica']}: {what}"
                              + (f" {done['moment']}" if done.get("moment") else ""))
        progress.show(job, replicas, time.monotonic())
        time.sleep(POLL_S)
    result.skipped += [f.describe() for f in pending]


def run_baseline(workdir: Path, data: Path, s: RunSettings) -> RunResult:
    """The same job without failures or agents: controller plus trainers started directly."""
    records, config = _prepare(workdir, s, data)
    secret = job_secret.generate()

    def body(controller, result: RunResult, children: list) -> None:
        for rid in replica_ids(s.replicas):
            for k in range(s.ranks_per_replica):
                env = {"FTHSDP_REPLICA_ID": rid, "FTHSDP_RANK": str(k), "FTHSDP_WORLD_SIZE": str(s.ranks_per_replica),
                       "FTHSDP_CONTROLLER": controller.grpc, "FTHSDP_JOB_ID": JOB_ID, **s.sync_environment()}
                children.append(procs.start_trainer(workdir / f"trainer-{rid}-{k}.log", config, env, secret))
        deadline = time.monotonic() + s.timeout_s
        for t in children:
            left = deadline - time.monotonic()
            if t.wait(max(left, 0.1)) != 0:
                raise RuntimeError(f"baseline trainer {t.args[-1]} exited with {t.returncode}; logs in {workdir}")

    return _with_controller(workdir, s, records, body, secret)
