"""A scripted trainer for agent tests and bench/swap: no model, just the process contract.

    python fake_trainer.py READY_DIR [--exit CODE] [--ignore-term] [--ignore-term-rank RANK] [--child] [ARGS...]

A standby (FTHSDP_STANDBY=1) first writes `standby-<pid>.json`, then blocks in
`agent.env.wait_for_assignment()`. Every trainer then prints "trainer ready" to stderr, writes
`ready-<replica>-<rank>-<pid>.json` (atomically) with its FTHSDP_* and torchrun (RANK, MASTER_ADDR...)
environment, argv and whether it started as a standby, and waits to be killed. `--exit CODE` exits instead (after printing
"boom" to stderr); `--ignore-term` ignores SIGTERM (`--ignore-term-rank RANK`: only as that rank); `--child` starts a child process that
waits too (its pid is in the ready file) to check that stops reach the process group.
`--join` makes rank 0 act as a minimal replica leader: Quorum, then ReportStep of the quorum's
max_step, every 0.3 s, so the controller sees the replica train (and rejoin after a swap).
`--finish-after N` (with --join) reports the replica finished after N steps counted from the
first step every configured replica trained together, then exits 0.
`--telemetry HOST:REPLICA` records a collective on its replica's group every 0.1 s in the ring
the agent asked for (fthsdp.telemetry); in REPLICA, the trainer on host HOST never joins
collective #5 (it hangs outside collectives), so its replica-mates wait in it forever.
`--ftar GROUP:SIZE` (with --telemetry) also records, after each of those, one FTAR all-reduce of
SIZE members on the cross-replica group GROUP (e.g. ftar.q1:2), as a replica's FTAR ring would.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

#: Set once this process is done (its leader reported the replica finished): every paced wait
#: below ends at once. The pauses stand for compute time and the failover rule's back-off; they
#: wait for nothing else.
DONE = threading.Event()


def write(path, values):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(values, f)
    os.rename(tmp, path)


def main():
    ready_dir, flags = sys.argv[1], sys.argv[2:]
    if "--ignore-term" in flags:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    standby = os.environ.get("FTHSDP_STANDBY") == "1"
    if standby:
        write(os.path.join(ready_dir, f"standby-{os.getpid()}.json"), {"pid": os.getpid()})
        from agent.env import wait_for_assignment
        wait_for_assignment()
    child = None
    if "--child" in flags:
        child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
    torchrun = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k.startswith("FTHSDP_") or k in torchrun}
    values = {"pid": os.getpid(), "env": env, "argv": sys.argv[1:], "warm": standby,
              "child_pid": child.pid if child else None, "time": time.time()}
    replica, rank = env.get("FTHSDP_REPLICA_ID", "?"), env.get("FTHSDP_RANK", "?")
    if "--ignore-term-rank" in flags and rank == flags[flags.index("--ignore-term-rank") + 1]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The stderr line first: a test that sees the ready file may kill the trainer at once and
    # then look for this line in the exit report's tail.
    print("trainer ready", file=sys.stderr, flush=True)
    write(os.path.join(ready_dir, f"ready-{replica}-{rank}-{os.getpid()}.json"), values)
    if "--exit" in flags:
        print("boom", file=sys.stderr, flush=True)
        sys.exit(int(flags[flags.index("--exit") + 1]))
    if "--telemetry" in flags:
        threading.Thread(target=collectives, args=(env, flags[flags.index("--telemetry") + 1]), daemon=True).start()
    if "--join" in flags and env.get("FTHSDP_RANK") == "0":
        train(env)
    threading.Event().wait()


def collectives(env, fault):
    from fthsdp.telemetry import Kind, Telemetry

    hang_host, hang_replica = fault.split(":")
    hung = env["FTHSDP_REPLICA_ID"] == hang_replica
    ring = Telemetry.from_env(env["FTHSDP_REPLICA_ID"], int(env["FTHSDP_RANK"]), time.monotonic())
    size = int(env["FTHSDP_WORLD_SIZE"])
    flags = sys.argv[2:]
    ftar = flags[flags.index("--ftar") + 1].rsplit(":", 1) if "--ftar" in flags else None
    for seq in range(10 ** 9):
        if DONE.is_set():
            return
        if hung and seq == 5 and env.get("FTHSDP_HOST_ID") == hang_host:
            return  # hung outside collectives: never joins #5
        token = ring.record_join(seq, Kind.ALL_REDUCE, "replica", 1024, time.monotonic(), group_size=size)
        if hung and seq == 5:
            return  # joined; waits for the hung peer forever
        DONE.wait(0.05)  # the collective's work
        ring.record_progress(token, 1024, time.monotonic())
        ring.record_done(token, time.monotonic())
        if ftar is not None:
            token = ring.record_join(seq, Kind.FTAR_ALL_REDUCE, ftar[0], 1024, time.monotonic(),
                                     group_size=int(ftar[1]))
            ring.record_progress(token, 1024, time.monotonic())
            ring.record_done(token, time.monotonic())
        DONE.wait(0.05)  # own work before the next one


def train(env):
    """A replica leader without a model: join each quorum, commit its max_step. It follows
    the shared failover rule (protos.dial.AddressRotation) over every controller address."""
    import uuid

    import grpc

    from protos import controller_pb2 as pb
    from protos import controller_pb2_grpc as pb_grpc
    from protos import credentials
    from protos.dial import FAILOVER_CODES, AddressRotation, leader_hint

    replica, world = env["FTHSDP_REPLICA_ID"], int(env["FTHSDP_WORLD_SIZE"])
    rotation = AddressRotation(env["FTHSDP_CONTROLLER"].split(","), base_s=0.1, cap_s=0.5)
    stubs = {a: pb_grpc.ControllerStub(grpc.insecure_channel(a)) for a in rotation.addresses}
    incarnation, step, known = uuid.uuid4().hex, 0, 0
    flags = sys.argv[2:]
    finish_after = int(flags[flags.index("--finish-after") + 1]) if "--finish-after" in flags else None
    counted = 0
    job, host = env.get("FTHSDP_JOB_ID", ""), env.get("FTHSDP_HOST_ID", "")
    # the leader's credential, as the runtime shows it: its agent's trainer token, when it has one
    token = env.get(credentials.ENV_TRAINER_TOKEN, "")
    credential = credentials.host_credential(token) if token else ""
    # A commit report that got no answer is sent again (to whichever controller the rotation
    # finds), as the runtime's coordinator does, before the next quorum: a leader may have
    # stored the commit and died before it answered, and its successor refuses that step again.
    report = None
    while True:
        stub, pause = stubs[rotation.current], 0.3
        try:
            if report is None:
                q = stub.Quorum(pb.QuorumRequest(
                    replica_id=replica, step=step, world_size=world, known_quorum_id=known,
                    incarnation=incarnation, job_id=job, host_id=host, credential=credential), timeout=30)
                report = q, pb.ReportStepRequest(replica_id=replica, quorum_id=q.quorum_id, step=q.max_step,
                                                 job_id=job, host_id=host, credential=credential)
            q, request = report
            try:
                stub.ReportStep(request, timeout=30)
            except grpc.RpcError as exc:
                if exc.code() not in FAILOVER_CODES:
                    report = None  # refused, not unanswered: the next quorum says what to train
                raise
            report = None
            step, known = q.max_step + 1, q.quorum_id
            rotation.succeeded()
            counted += bool(counted) or len(q.members) == q.total_replicas
            if finish_after is not None and counted >= finish_after:
                stub.ReportFinished(pb.ReportFinishedRequest(replica_id=replica, step=q.max_step, job_id=job,
                                                             host_id=host, reason="fake trainer done",
                                                             credential=credential), timeout=30)
                print("replica finished", file=sys.stderr, flush=True)
                DONE.set()
                sys.exit(0)
        except grpc.RpcError as exc:
            print(f"controller: {exc.code().name}: {exc.details()}", file=sys.stderr, flush=True)
            if exc.code() in FAILOVER_CODES:
                pause = rotation.failed(leader_hint(exc))
        DONE.wait(pause)  # a step's pace, or the rotation's back-off after a failed call


if __name__ == "__main__":
    main()
