"""Spare swap time: from a trainer's death to the spare's trainer reporting ready.

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

Prints the median over trials of each, as one JSON line with --json:
    {"swap_warm_s": ..., "swap_cold_s": ..., "trials": N, "weights_mb": MB}
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

CLI = [sys.executable, "-m", "fthsdp.cli"]
BOUND_S = 60.0


def trainer(ready_dir: str, weights_mb: int) -> None:
    """The scripted trainer (run as `python -m bench.swap --as-trainer DIR MB`)."""
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
    tmp = Path(ready_dir, f".ready-{os.getpid()}")
    tmp.write_text(json.dumps(stamp))
    tmp.rename(Path(ready_dir, f"ready-{os.getpid()}.json"))
    signal.pause()


def _wait(what: str, check):
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.005)
    raise TimeoutError(f"bench: timed out waiting for {what}")


def _ready(ready_dir: Path, host: str) -> dict | None:
    for path in ready_dir.glob("ready-*.json"):
        stamp = json.loads(path.read_text())
        if stamp["host"] == host:
            return stamp
    return None


def trial(root: Path, warm: bool, weights_mb: int) -> float:
    """One failure and swap; seconds from the kill to the spare's trainer being ready."""
    ready_dir = root / "ready"
    ready_dir.mkdir()
    procs: list[subprocess.Popen] = []

    def spawn(name: str, args: list[str]) -> subprocess.Popen:
        with open(root / f"{name}.out", "wb") as out, open(root / f"{name}.err", "wb") as err:
            procs.append(subprocess.Popen(args, stdout=out, stderr=err,
                                          stdin=subprocess.DEVNULL))
        return procs[-1]

    def first_line(name: str) -> dict | None:
        text = (root / f"{name}.out").read_text()
        return json.loads(text.splitlines()[0]) if "\n" in text else None

    command = ["--", sys.executable, "-m", "bench.swap", "--as-trainer", str(ready_dir),
               str(weights_mb)]
    try:
        spawn("controller", CLI + ["controller", "--grpc-port", "0", "--http-port", "0",
                                   "--replicas", "1", "--heartbeat-timeout-s", "3", "--restart-budget", "0"])
        grpc_address = _wait("controller", lambda: first_line("controller"))["grpc"]
        agent = CLI + ["agent", "--controller", grpc_address, "--heartbeat-interval-s", "0.5"]
        spawn("h1", agent + ["--host-id", "h1", "--replica-id", "r0", "--ranks", "0",
                             "--world-size", "1"] + command)
        spawn("h2", agent + ["--host-id", "h2", "--spare"] + (["--standby"] if warm else [])
              + command)
        victim = _wait("h1's trainer", lambda: _ready(ready_dir, "h1"))
        _wait("h2 registered", lambda: first_line("h2"))
        if warm:
            _wait("h2's standby", lambda: list(ready_dir.glob("standby-*")))
        killed_at = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        spare = _wait("h2's trainer", lambda: _ready(ready_dir, "h2"))
        assert (spare["replica"], spare["rank"]) == ("r0", "0"), spare
        return spare["time"] - killed_at
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--as-trainer"]:
        trainer(argv[1], int(argv[2]))
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
    results: dict[str, list[float]] = {"warm": [], "cold": []}
    with tempfile.TemporaryDirectory(prefix="fthsdp-bench-swap-") as tmp:
        for i in range(args.trials):
            for mode in ("warm", "cold"):
                root = Path(tmp, f"{mode}{i}")
                root.mkdir()
                results[mode].append(trial(root, mode == "warm", args.weights_mb))
                if not args.json:
                    print(f"trial {i} {mode}: {results[mode][-1]:.3f} s", flush=True)
    summary = {"swap_warm_s": round(statistics.median(results["warm"]), 3),
               "swap_cold_s": round(statistics.median(results["cold"]), 3),
               "trials": args.trials, "weights_mb": args.weights_mb}
    print(json.dumps(summary) if args.json else
          f"median swap: warm {summary['swap_warm_s']} s, cold {summary['swap_cold_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
