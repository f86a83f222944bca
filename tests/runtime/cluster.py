"""A test cluster on loopback: a controller (CLI subprocess) and replicas of trainer processes.

    result = Cluster(tmp_path, replicas=3, ranks=2, steps=10,
                     faults=Faults().kill(replica=1, at_step=4)).run()

The cluster plays the agent's part: when a rank dies it kills the rest of its replica and
starts the replica again (new incarnation). Waits block on process exit (pidfd), bounded.
Trainers are forked from a server that imported torch once (tests/forked.py).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from controller.launch import ControllerProcess, launch
from tests import forked, trainer_secret
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
FTHSDP = str(Path(PYTHON).with_name("fthsdp"))


class Faults:
    """What goes wrong, where: a builder of fault descriptions for the workers."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def kill(self, replica: int, at_step: int, rank: int = 0) -> "Faults":
        """The rank exits (as if SIGKILLed) right after its FTAR all-reduce of `at_step` started."""
        self.items.append({"kind": "kill", "replica": str(replica), "step": at_step, "rank": rank})
        return self

    def sigkill(self, replica: int, at_step: int, rank: int = 0) -> "Faults":
        """The rank gets a real SIGKILL right after its first FTAR all-reduce of `at_step` started
        (with FSDP2: in the middle of backward)."""
        self.items.append({"kind": "sigkill", "replica": str(replica), "step": at_step, "rank": rank})
        return self

    def abort(self, replica: int, at_step: int, rank: int = 1) -> "Faults":
        """The rank votes no on `at_step` after its all-reduce succeeded (others include its gradient)."""
        self.items.append({"kind": "abort", "replica": str(replica), "step": at_step, "rank": rank})
        return self

    def kill_source(self, replica: int) -> "Faults":
        """Every rank of the replica exits (as if SIGKILLed) right after its FTAR all-reduce of the
        first step in which a behind replica fetches from it started: the catch-up loses its source."""
        self.items.append({"kind": "kill_source", "replica": str(replica), "step": -1, "rank": None})
        return self

    def sigkill_inner(self, replica: int, at_step: int, inner: int) -> "Faults":
        """A semi-synchronous replica gets a real SIGKILL in inner step `inner` of sync `at_step`
        (tests/runtime/semisync_worker.py)."""
        self.items.append({"kind": "sigkill_inner", "replica": str(replica), "step": at_step, "inner": inner,
                           "rank": None})
        return self

    def fresh_start(self, replica: int) -> "Faults":
        """The replica's first start finds no checkpoint (as if it started before any was written)."""
        self.items.append({"kind": "fresh_start", "replica": str(replica), "step": -1, "rank": None})
        return self

    def corrupt(self, replica: int, after_step: int, rank: int = 0) -> "Faults":
        """Silent data corruption: right after committing `after_step`, one weight of the rank
        changes (the runtime is not told; only digests can notice)."""
        self.items.append({"kind": "corrupt", "replica": str(replica), "step": after_step, "rank": rank})
        return self


def _read_line(proc: forked.Forked, timeout_s: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box or not box[0]:
        raise RuntimeError(f"{proc.args[:3]} printed no line within {timeout_s}s")
    return box[0]


def start_controller(log_path: Path, replicas: int, join_timeout_s: float, heartbeat_timeout_s: float,
                     lr_policy: str = "sqrt", settings: dict | None = None) -> ControllerProcess:
    extra: tuple[str, ...] = ()
    if settings:  # more ControllerSettings fields, as a --settings file
        path = log_path.with_name("controller-settings.json")
        path.write_text(json.dumps(settings))
        extra = ("--settings", str(path))
    with open(log_path, "w") as log:
        min_replicas = (settings or {}).get("min_replicas", 1)  # a flag: it would override the file's
        return launch("--replicas", str(replicas), "--min-replicas", str(min_replicas),
                      "--join-timeout-s", str(join_timeout_s),
                      "--heartbeat-timeout-s", str(heartbeat_timeout_s), "--lr-policy", lr_policy, "--job-id", "t",
                      *extra, stderr=log, timeout_s=30.0, cwd=str(REPO),
                      insecure=True)  # in-process managers of these tests hold no secret


@dataclass
class Cluster:
    workdir: Path
    replicas: int = 3
    ranks: int = 2
    steps: int = 10
    faults: Faults = field(default_factory=Faults)
    join_timeout_s: float = 1.0
    heartbeat_timeout_s: float = 3.0
    controller_lr_policy: str = "sqrt"
    checkpoint_every: int = 0
    restarts: int = 1  # per replica
    configured_replicas: int = 0  # the controller's --replicas (default: `replicas`)
    checkpoint_dir: Path | None = None  # default: <workdir>/ckpt
    ddp: bool = False  # train through DistributedDataParallel + ddp_comm_hook
    max_steps: int = 2000  # safety cap while waiting for a restarted replica to rejoin
    late: dict[int, int] = field(default_factory=dict)  # replica -> starts once replica 0 committed this step
    worker: dict = field(default_factory=dict)  # more settings for every worker (tests/runtime/train_worker.py)
    overrides: dict[int, dict] = field(default_factory=dict)  # replica -> more settings for its workers
    no_restart: frozenset[int] = frozenset()  # replicas left dead when they fail (the run goes on without them)
    controller_settings: dict = field(default_factory=dict)  # more ControllerSettings fields
    kill_all_after: int | None = None  # every worker stops after committing this step; then all get SIGKILL
    module: str = "tests.runtime.train_worker"  # the trainer each worker runs (python -m MODULE CONFIG_JSON)
    #: the controllers' gRPC addresses ("a,b": HA), started and stopped by the caller (default: the
    #: cluster starts one of its own)
    controller_address: str = ""

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.records_dir = self.workdir / "records"
        self.records_dir.mkdir(exist_ok=True)
        self.checkpoint_dir = self.checkpoint_dir or self.workdir / "ckpt"
        self._procs: dict[int, list[forked.Forked]] = {}
        self._incarnation: dict[int, int] = {}

    def _spawn(self, controller: str, replica: int) -> None:
        inc = self._incarnation.get(replica, -1) + 1
        self._incarnation[replica] = inc
        coordinator, gloo = f"127.0.0.1:{free_port()}", free_port()
        procs = []
        for rank in range(self.ranks):
            cfg = {"replica_id": str(replica), "rank": rank, "world_size": self.ranks, "incarnation": inc,
                   "controller": controller, "coordinator_address": coordinator, "gloo_port": gloo,
                   "steps": self.steps, "max_steps": self.max_steps, "replicas": self.replicas, "faults": self.faults.items,
                   "record": str(self.records_dir / f"{replica}-{rank}-{inc}.jsonl"),
                   "checkpoint_dir": str(self.checkpoint_dir) if self.checkpoint_every else "",
                   "checkpoint_every": self.checkpoint_every, "ddp": self.ddp, "stop_after": self.kill_all_after,
                   **self.worker, **self.overrides.get(replica, {})}
            procs.append(forked.start(self.module, [json.dumps(cfg)], cwd=REPO,
                                      log=self.workdir / f"worker-{replica}-{rank}-{inc}.log",
                                      env={**os.environ, **trainer_secret.ENV}))
        self._procs[replica] = procs
        if inc > 0 or replica in self.late:
            self._go(procs, 120.0)

    def _go(self, procs: list[forked.Forked], timeout_s: float) -> None:
        """Wait for each worker's "ready" (pre-init done), then let them all report in."""
        for p in procs:
            if _read_line(p, timeout_s).strip() != "ready":
                raise AssertionError(f"worker {p.args} did not get ready; logs in {self.workdir}")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()

    def run(self, timeout_s: float = 90.0) -> "Records":
        controller = None if self.controller_address else start_controller(
            self.workdir / "controller.log", self.configured_replicas or self.replicas, self.join_timeout_s,
            self.heartbeat_timeout_s, self.controller_lr_policy, self.controller_settings)
        address = self.controller_address or controller.grpc
        try:
            for r in range(self.replicas):
                if r not in self.late:
                    self._spawn(address, r)
            self._go([p for procs in self._procs.values() for p in procs], 120.0)
            self._supervise(address, time.monotonic() + timeout_s)
        finally:
            for procs in self._procs.values():
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                    p.close()
            if controller is not None:
                controller.stop()
        return Records.load(self.records_dir)

    def _committed(self, replica: int) -> int:
        """The highest step replica's rank 0 (first incarnation) committed so far, from its record."""
        path = self.records_dir / f"{replica}-0-0.jsonl"
        steps = [json.loads(line)["step"] for line in path.read_text().splitlines()
                 if line.endswith("}") and '"event": "commit"' in line] if path.exists() else []
        return max(steps, default=-1)

    def _supervise(self, controller: str, deadline: float) -> None:
        restarts = {r: 0 for r in range(self.replicas)}
        left_dead: set[int] = set()
        waiting = dict(self.late)
        while True:
            if self.kill_all_after is not None and self._all_stopped():
                self._kill_all()
                return
            for r, at in list(waiting.items()):
                if self._committed(0) >= at:
                    del waiting[r]
                    self._spawn(controller, r)
            running = {p.pid: (r, p) for r, procs in self._procs.items() for p in procs if p.poll() is None}
            for r, procs in self._procs.items():
                codes = [p.poll() for p in procs]
                if any(c not in (None, 0) for c in codes) and r not in left_dead:
                    for p in procs:
                        if p.poll() is None:
                            p.kill()
                            p.wait()
                    if r in self.no_restart:
                        left_dead.add(r)
                        continue
                    if restarts[r] >= self.restarts:
                        raise AssertionError(f"replica {r} failed again: exit codes {codes}; see {self.workdir}")
                    restarts[r] += 1
                    self._spawn(controller, r)
                    break
            else:
                if not running:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"cluster did not finish in time; logs in {self.workdir}")
                # while a late replica or a whole-job kill waits for its cue, look at the records often
                often = waiting or self.kill_all_after is not None
                _wait_any_exit([p.pid for _, p in running.values()], min(left, 0.2 if often else 5.0))

    def _all_stopped(self) -> bool:
        """Every worker of every replica committed `kill_all_after` and waits to be killed."""
        stopped = 0
        for path in self.records_dir.glob("*.jsonl"):
            stopped += '"event": "stopped"' in path.read_text()
        return stopped >= self.replicas * self.ranks

    def _kill_all(self) -> None:
        """The whole job dies at once (every trainer process SIGKILLed, as by a lost data centre)."""
        for procs in self._procs.values():
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
        for procs in self._procs.values():
            for p in procs:
                p.wait()


def _wait_any_exit(pids: list[int], timeout_s: float) -> None:
    sel = selectors.DefaultSelector()
    fds = []
    try:
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                return
            fds.append(fd)
            sel.register(fd, selectors.EVENT_READ)
        sel.select(timeout_s)
    finally:
        sel.close()
        for fd in fds:
            os.close(fd)


@dataclass
class Records:
    rows: list[dict]

    @classmethod
    def load(cls, folder: Path) -> "Records":
        rows = []
        for path in sorted(folder.glob("*.jsonl")):
            rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return cls(sorted(rows, key=lambda r: r["t"]))

    def where(self, **match) -> list[dict]:
        return [r for r in self.rows if all(r.get(k) == v for k, v in match.items())]
