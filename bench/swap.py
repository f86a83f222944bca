"""Spare swap time (a trainer's death to the spare's trainer reporting ready) and replica
restart time (a rank's death to its replica committing again).

    python -m bench.swap [--json] [--trials N] [--weights-mb MB]

Each trial runs a real controller (restart budget 0: the first death replaces the host) and two
real agents on loopback: an active host h1 running replica r0, and a spare h2. The bench
SIGKILLs h1's trainer; h1's agent reports the exit, the controller cordons h1 and sends ASSIGN
to h2, and h2's trainer writes a ready file stamped with its clock. Two ways to run the spare:

- warm (`--standby`): h2's trainer was pre-started with FTHSDP_STANDBY=1 and finished its
  set-up before the failure; on ASSIGN the agent writes the assignment to its stdin.
- cold: h2 starts the trainer process on ASSIGN, so the swap pays interpreter start-up and
  the trainer's set-up.

The scripted trainer's set-up models what a real trainer does before it can join: imports
(`import numpy`, a real import) and building its model (allocating and initialising
`--weights-mb` of float32 weights, a sleep-free, CPU-bound step). A real PyTorch trainer pays
far more (torch and CUDA initialisation, NCCL, data loader, checkpoint reader: tens of
seconds); the cold number grows with that cost, the warm number does not.

The replica restart trial runs the controller's own layout (2 replicas x 2 hosts x 1 rank,
each agent on its own loopback address as with --advertise-address in a pod) with the same
scripted trainer; rank 0 of each replica also acts as a minimal leader (joins each quorum,
reports its step). The bench SIGKILLs rank 1 of r0 (its second host): the controller restarts
r0 as a unit (a RESTART order to both its hosts), both ranks start cold, and r0's new rank 0
rejoins behind r1 and commits. `replica_restart_s` is the time from the kill to that commit.

Every trial runs the product as the docs start it: `fthsdp controller` and `fthsdp agent` with
a job secret made for the trial (`--job-secret-file`); the scripted leader shows the trainer
token its agent handed it.

Prints the median over trials of each, as one JSON line with --json (FIELDS):
    swap_warm_s, swap_cold_s, replica_restart_s (seconds), trials, weights_mb
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import secret_file

CLI = [sys.executable, "-m", "fthsdp.cli"]
BOUND_S = 60.0
#: the fields of the JSON line (`python -m bench.swap --json`) and their types
FIELDS = {"swap_warm_s": float, "swap_cold_s": float, "replica_restart_s": float, "trials": int, "weights_mb": int}


def trainer(ready_dir: str, weights_mb: int, lead: bool = False) -> None:
    """The scripted trainer (run as `python -m bench.swap --as-trainer DIR MB [--lead]`)."""
    import numpy as np  # the import cost a cold start pays

    rng = np.random.default_rng(0)
    weights = rng.standard_normal(weights_mb * (1 << 20) // 4, dtype=np.float32)
    weights *= 0.02  # "initialise" the model
    if os.environ.get("FTHSDP_STANDBY") == "1":
        from agent.env import wait_for_assignment

        Path(ready_dir, f"standby-{os.getpid()}").write_text("")
        wait_for_assignment()
    stamp = {"time": time.time(), "host": os.environ["FTHSDP_HOST_ID"],
             "replica": os.environ["FTHSDP_REPLICA_ID"], "rank": os.environ["FTHSDP_RANK"],
             "pid": os.getpid(), "checksum": float(weights[:4].sum())}
    _stamp(Path(ready_dir, f"ready-{os.getpid()}.json"), stamp)
    if lead and os.environ["FTHSDP_RANK"] == "0":
        _lead(Path(ready_dir, f"commit-{os.getpid()}.json"))
    signal.pause()


def _stamp(path: Path, values: dict) -> None:
    tmp = path.with_name("." + path.name)
    tmp.write_text(json.dumps(values))
    tmp.rename(path)


def _lead(first_commit: Path) -> None:
    """Rank 0 as a replica leader without a model: join each quorum and report its step as
    committed; the time of this process's first commit goes to `first_commit`."""
    import uuid

    import grpc

    from protos import controller_pb2 as pb
    from protos import controller_pb2_grpc as pb_grpc
    from protos import credentials

    env = os.environ
    stub = pb_grpc.ControllerStub(grpc.insecure_channel(env["FTHSDP_CONTROLLER"]))
    # the credential its agent handed it (the trainer token of its host), as a real leader shows
    ids = {"job_id": env["FTHSDP_JOB_ID"], "replica_id": env["FTHSDP_REPLICA_ID"], "host_id": env["FTHSDP_HOST_ID"],
           "credential": credentials.host_credential(env[credentials.ENV_TRAINER_TOKEN])}
    incarnation, step, known = uuid.uuid4().hex, 0, 0
    while True:
        try:
            q = stub.Quorum(pb.QuorumRequest(step=step, world_size=int(env["FTHSDP_WORLD_SIZE"]), incarnation=incarnation,
                                             known_quorum_id=known, **ids), timeout=30)
            stub.ReportStep(pb.ReportStepRequest(quorum_id=q.quorum_id, step=q.max_step, **ids), timeout=30)
        except grpc.RpcError:
            time.sleep(0.05)
            continue
        if not first_commit.exists():
            _stamp(first_commit, {"time": time.time(), "replica": ids["replica_id"], "step": q.max_step})
        step, known = q.max_step + 1, q.quorum_id
        time.sleep(0.05)


def _wait(what: str, check, log: Path | None = None):
    """`check()`'s first truthy value within BOUND_S; TimeoutError naming `what` (and the last
    lines of `log`, where the process that should have answered says why) otherwise."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.005)
    tail = "".join(log.read_text().splitlines(keepends=True)[-5:]) if log and log.exists() else ""
    raise TimeoutError(f"bench: timed out waiting for {what}" + (f"; its log ends:\n{tail}" if tail else ""))


def _stamps(ready_dir: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in ready_dir.glob("ready-*.json")]


def _ready(ready_dir: Path, host: str) -> dict | None:
    """The newest ready stamp of a trainer on `host`."""
    mine = [s for s in _stamps(ready_dir) if s["host"] == host]
    return max(mine, key=lambda s: s["time"]) if mine else None


class Processes:
    """The processes of one trial, started here and stopped here by PID (agents first)."""

    def __init__(self, root: Path) -> None:
        self.root, self.procs = root, []
        self.ready_dir = root / "ready"
        self.ready_dir.mkdir()
        self.secret = str(secret_file(root))  # one per trial, as a user makes one per job

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.root / f"{name}.out", "wb") as out, open(self.root / f"{name}.err", "wb") as err:
            self.procs.append(subprocess.Popen(args, stdout=out, stderr=err, stdin=subprocess.DEVNULL))
        return self.procs[-1]

    def first_line(self, name: str) -> dict | None:
        text = (self.root / f"{name}.out").read_text()
        return json.loads(text.splitlines()[0]) if "\n" in text else None

    def controller(self, *flags: str) -> str:
        self.spawn("controller", CLI + ["controller", "--grpc-port", "0", "--http-port", "0",
                                        "--heartbeat-timeout-s", "3", "--job-secret-file", self.secret, *flags])
        return _wait("controller", lambda: self.first_line("controller"), self.root / "controller.err")["grpc"]

    def agent(self, grpc_address: str, host: str, *flags: str) -> list[str]:
        """`fthsdp agent` as the docs start one, with this trial's job secret."""
        return CLI + ["agent", "--controller", grpc_address, "--host-id", host, "--heartbeat-interval-s", "0.5",
                      "--job-secret-file", self.secret, *flags]

    def trainer_command(self, weights_mb: int, *flags: str) -> list[str]:
        return ["--", sys.executable, "-m", "bench.swap", "--as-trainer", str(self.ready_dir), str(weights_mb), *flags]

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def trial(root: Path, warm: bool, weights_mb: int) -> float:
    """One failure and swap; seconds from the kill to the spare's trainer being ready."""
    run = Processes(root)
    try:
        # restart budget 0: the first death replaces the host
        grpc_address = run.controller("--replicas", "1", "--restart-budget", "0")
        command = run.trainer_command(weights_mb)
        run.spawn("h1", run.agent(grpc_address, "h1", "--replica-id", "r0", "--ranks", "0", "--world-size", "1")
                  + command)
        run.spawn("h2", run.agent(grpc_address, "h2", "--spare", *(["--standby"] if warm else [])) + command)
        victim = _wait("h1's trainer", lambda: _ready(run.ready_dir, "h1"))
        _wait("h2 registered", lambda: run.first_line("h2"), run.root / "h2.err")
        if warm:
            _wait("h2's standby", lambda: list(run.ready_dir.glob("standby-*")))
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        spare = _wait("h2's trainer", lambda: _ready(run.ready_dir, "h2"))
        assert (spare["replica"], spare["rank"]) == ("r0", "0"), spare
        return spare["time"] - killed_at
    finally:
        run.stop()


def replica_restart_trial(root: Path, weights_mb: int) -> float:
    """Kill rank 1 of a 2-host replica; seconds until that replica's new rank 0 commits."""
    run = Processes(root)
    try:
        grpc_address = run.controller("--replicas", "2", "--hosts-per-replica", "2", "--ranks-per-host", "1",
                                      "--join-timeout-s", "1")
        command = run.trainer_command(weights_mb, "--lead")
        for i in range(4):  # in this order: h1, h2 hold r0; h3, h4 hold r1
            run.spawn(f"h{i + 1}", run.agent(grpc_address, f"h{i + 1}", "--advertise-address", f"127.0.0.{i + 2}")
                      + command)
            _wait(f"h{i + 1} registered", lambda: run.first_line(f"h{i + 1}"), run.root / f"h{i + 1}.err")
        leaders = {_wait(f"{host}'s trainer", lambda: _ready(run.ready_dir, host))["pid"] for host in ("h1", "h3")}
        _wait("both replicas commit", lambda: all(run.ready_dir.joinpath(f"commit-{p}.json").exists() for p in leaders))
        victim = _ready(run.ready_dir, "h2")
        assert (victim["replica"], victim["rank"]) == ("r0", "1"), victim
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)

        def committed_again():
            for path in run.ready_dir.glob("commit-*.json"):
                stamp = json.loads(path.read_text())
                if stamp["replica"] == "r0" and int(path.stem.split("-")[1]) not in leaders:
                    return stamp
            return None
        again = _wait("r0 committing again", committed_again)
        def restarted_ranks():  # both ranks restarted together (rank 1's stamp may follow rank 0's commit)
            ranks = {s["rank"] for s in _stamps(run.ready_dir) if s["replica"] == "r0" and s["time"] > killed_at}
            return ranks if ranks == {"0", "1"} else None
        _wait("both ranks of r0 restarted", restarted_ranks)
        return again["time"] - killed_at
    finally:
        run.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--as-trainer"]:
        trainer(argv[1], int(argv[2]), lead="--lead" in argv[3:])
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.swap", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON line on stdout")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--weights-mb", type=int, default=256,
                   help="float32 weights the scripted trainer initialises during set-up")
    args = p.parse_args(argv)
    if args.trials < 1 or args.weights_mb < 0:
        p.error(f"--trials must be >= 1 and --weights-mb >= 0, got {args.trials} and "
                f"{args.weights_mb}")
    results: dict[str, list[float]] = {"warm": [], "cold": [], "replica_restart": []}
    with tempfile.TemporaryDirectory(prefix="fthsdp-bench-swap-") as tmp:
        for i in range(args.trials):
            for mode in results:
                root = Path(tmp, f"{mode}{i}")
                root.mkdir()
                results[mode].append(replica_restart_trial(root, args.weights_mb) if mode == "replica_restart"
                                     else trial(root, mode == "warm", args.weights_mb))
                if not args.json:
                    print(f"trial {i} {mode}: {results[mode][-1]:.3f} s", flush=True)
    summary = {"swap_warm_s": round(statistics.median(results["warm"]), 3),
               "swap_cold_s": round(statistics.median(results["cold"]), 3),
               "replica_restart_s": round(statistics.median(results["replica_restart"]), 3),
               "trials": args.trials, "weights_mb": args.weights_mb}
    print(json.dumps(summary) if args.json else
          f"median swap: warm {summary['swap_warm_s']} s, cold {summary['swap_cold_s']} s; "
          f"replica restart {summary['replica_restart_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
