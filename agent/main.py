"""`fthsdp agent`: the per-host trainer supervisor.

    fthsdp agent --controller ADDR[,ADDR...] --host-id ID [--spare] [--slots N]
        [--labels zone=a,rack=3] [--replica-id R --ranks 0,1 --world-size 2]
        [--advertise-address IP] [--rendezvous-port P --coordinator-port P]
        [--state-dir DIR] [--standby-restart-budget N --standby-restart-window-s S] [--standby]
        [--warm-restarts]
        [--job-id J]
        [--on-job-complete exit|idle] [--job-secret-file PATH | --insecure]
        -- COMMAND TEMPLATE...

Without --spare and without --replica-id the host is available: the controller picks the
work, a slot of its own replica layout (`--hosts-per-replica`), or the spare pool when it has
none or it is full. --advertise-address is where other hosts reach this one (its pod IP):
replicas that span hosts meet at the address of their rank-0 host (MASTER_ADDR). A trainer
that dies is not restarted alone: the controller restarts its replica on all its hosts.
The command template may use {replica_id} {rank} {world_size} {host_id} {job_id} {slot}
(other braces are left alone); the trainer's environment is described in `agent.env`.
The job secret that authenticates the trainers' ports comes from --job-secret-file, else
FTHSDP_JOB_SECRET_FILE, else FTHSDP_JOB_SECRET (protos/job_secret.py); the agent checks it
at start and hands it to every trainer in its environment. Without one it refuses to start
(exit 2) unless --insecure is given (trainers' ports then run without authentication).
Prints one JSON line to stdout once first registered, then logs to stderr:

    {"event": "registered", "host_id": "h1", "assignment": {...} | null, "pid": PID}

Exit status: 0 after SIGTERM/SIGINT (trainers stopped, the host deregistered: its work moves
to a spare) or once the controller says the job is COMPLETED and its trainers ended (each may
finish its own work after Manager.close() and exit on its own for --finish-grace-s, then it is
stopped; with --on-job-complete idle the agent stays instead; with pool it serves the next job its
--controller address answers for, a different job id), 2 for bad arguments, 3 when the
controller refuses the registration (a duplicate assignment, a job secret that differs from the
controller's, another live agent with the same host id), 4 once the controller says the job is
FAILED (trainers stopped; no replica could make progress), 5 when no controller address answered
a first registration for --connect-timeout-s (default 60), or answered again within
--reconnect-timeout-s (default 300) after a working session. Failed attempts are logged once per
doubling of their count, each line with the address and the reason. While another live agent
holds the host id, the agent waits and registers again (or takes the host over at once with the
secret its predecessor kept in --state-dir); if that agent is still alive after
--connect-timeout-s, this one exits 3 naming its incarnation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping

# Trainers are fork+exec'ed at once and never use the agent's gRPC state, so gRPC's fork
# handlers (and their "skipping fork() handlers" warning) are not needed. Set before import;
# trainers get the environment as it was before (_TRAINER_BASE_ENV).
_TRAINER_BASE_ENV = dict(os.environ)
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from agent.policy import ON_JOB_COMPLETE  # noqa: E402
from agent.runner import Agent, ConnectTimeout, PermanentError  # noqa: E402
from agent.settings import AgentSettings  # noqa: E402
from protos import cli_flags as flags  # noqa: E402
from protos import dial, job_secret, timeout_rules  # noqa: E402

log = logging.getLogger("agent")
#: The agent's exit status once the controller says the job is FAILED.
EXIT_JOB_FAILED = 4
#: The agent's exit status when no controller answered for --connect-timeout-s.
EXIT_CONNECT_TIMEOUT = 5


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _labels(text: str) -> dict[str, str]:
    labels = {}
    for part in _csv(text):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"label {part!r} is not KEY=VALUE")
        labels[key] = value
    return labels


def _addresses(text: str) -> list[str]:
    try:
        return dial.parse_addresses(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def _ranks(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(r) for r in _csv(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"ranks {text!r} are not comma-separated integers")


def _seconds_from_env(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name, "")
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not a number of seconds") from None


def add_timeout_flags(p: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """The agent's timeout flags (also `fthsdp timeouts`'): each must keep the rules of
    protos/timeout_rules.py with the others (docs/operations.md, "Timeouts"). The connect
    timeouts' defaults come from `environ`'s variables where set (flags win)."""
    d, env = AgentSettings, {} if environ is None else environ
    p.add_argument("--connect-timeout-s", type=timeout_rules.seconds, metavar="S",
                   default=_seconds_from_env(env, dial.ENV_CONNECT_TIMEOUT_S, d.connect_timeout_s),
                   help=f"give up (exit 5) once no controller address answered a first registration for this long "
                        f"(or env {dial.ENV_CONNECT_TIMEOUT_S}; default {d.connect_timeout_s:g})")
    p.add_argument("--reconnect-timeout-s", type=timeout_rules.seconds, metavar="S",
                   default=_seconds_from_env(env, dial.ENV_RECONNECT_TIMEOUT_S, d.reconnect_timeout_s),
                   help=f"the same once a controller had answered: a failover or restart may take this long "
                        f"(or env {dial.ENV_RECONNECT_TIMEOUT_S}; default {d.reconnect_timeout_s:g})")
    p.add_argument("--heartbeat-interval-s", type=timeout_rules.seconds, default=d.heartbeat_interval_s, metavar="S",
                   help=f"beat this often (default {d.heartbeat_interval_s:g}); at most a third of the controller's "
                        f"--heartbeat-timeout-s, at most half the agent's call timeout ({d.rpc_timeout_s:g} s)")
    p.add_argument("--stop-grace-s", type=float, default=d.stop_grace_s, metavar="S",
                   help=f"a stopped trainer gets SIGTERM, then SIGKILL this long after (default {d.stop_grace_s:g})")
    p.add_argument("--finish-grace-s", type=float, default=d.finish_grace_s, metavar="S",
                   help=f"once the job is COMPLETED, trainers may finish their own work after Manager.close() "
                        f"(export, evaluation) and exit on their own for this long before they are stopped "
                        f"(default {d.finish_grace_s:g})")
    p.add_argument("--reserve-delay-s", type=float, default=d.reserve_delay_s, metavar="S",
                   help=f"with --warm-restarts: start a reserve this long after its trainer (default "
                        f"{d.reserve_delay_s:g})")
    p.add_argument("--telemetry-interval-s", type=float, default=d.telemetry_interval_s, metavar="S",
                   help="send trainers' collective telemetry every this many seconds (0: off; default "
                        f"{d.telemetry_interval_s:g}); at most half the controller's diagnosis "
                        "telemetry_stale_s")


def parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The command line (without the trainer's command template, which follows `--`); the
    connect timeouts' defaults from `environ` (none: the built-in ones)."""
    p = argparse.ArgumentParser(
        prog="fthsdp agent", description=__doc__, formatter_class=flags.DefaultsFormatter,
        usage="%(prog)s --controller ADDR[,ADDR...] --host-id ID [options] -- COMMAND TEMPLATE...")
    flags.add_version(p)
    p.add_argument("--controller", required=True, type=_addresses,
                   help="controller gRPC address(es) host:port, comma-separated, tried in order (required)")
    p.add_argument("--host-id", required=True,
                   help="this host's id in the job, unique among its agents (required)")
    p.add_argument("--spare", action="store_true", help="register as a warm spare")
    p.add_argument("--slots", type=int, default=0,
                   help="trainer processes this host can run (default 0: the number of ranks)")
    p.add_argument("--labels", type=_labels, default={}, help="KEY=VALUE,... e.g. zone=a,rack=3 (default: none)")
    p.add_argument("--replica-id", default="",
                   help="the replica this host runs (default: none, the controller assigns one or a spare slot)")
    p.add_argument("--ranks", type=_ranks, default=(),
                   help="with --replica-id: its ranks on this host, comma-separated (default: none)")
    p.add_argument("--world-size", type=int, default=0,
                   help="with --replica-id: the replica's rank count (default 0: none given)")
    p.add_argument("--job-id", default="",
                   help="passed to trainers as FTHSDP_JOB_ID (default: empty, the controller's)")
    p.add_argument("--advertise-address", default="",
                   help="where other hosts reach this host's trainers (its pod IP), without a port "
                        "(default: empty: every host on this machine, replicas meet on loopback)")
    p.add_argument("--rendezvous-port", type=flags.port, default=0,
                   help="MASTER_PORT of a replica whose rank 0 runs here, 0..65535 (default 0: a free port)")
    p.add_argument("--coordinator-port", type=flags.port, default=0,
                   help="port of the coordinator of a replica whose rank 0 runs here, 0..65535 "
                        "(default 0: a free port)")
    p.add_argument("--state-dir", default="",
                   help="keep the registration's secret here, so a restarted agent takes its host over at once "
                        "(default: empty, kept nowhere)")
    # Not the controller's --restart-budget (replica restarts a host's trainer deaths may cause):
    # this one counts local restarts of standby trainers.
    p.add_argument("--standby-restart-budget", dest="restart_budget", type=int, default=3, metavar="N",
                   help="local restarts of a standby trainer (one without work) allowed per "
                        "--standby-restart-window-s before the agent gives up on it")
    p.add_argument("--standby-restart-window-s", dest="restart_window_s", type=float, default=AgentSettings.restart_window_s, metavar="S",
                   help="the window of --standby-restart-budget")
    why = "the controller's --restart-budget is another thing"
    p.add_argument("--restart-budget", dest="restart_budget", type=int, action=flags.Deprecated,
                   new="--standby-restart-budget", why=why)
    p.add_argument("--restart-window-s", dest="restart_window_s", type=float, action=flags.Deprecated,
                   new="--standby-restart-window-s")
    p.add_argument("--standby", action="store_true",
                   help="pre-start trainers with FTHSDP_STANDBY=1 while unassigned")
    p.add_argument("--warm-restarts", action="store_true",
                   help="keep a pre-started standby next to each trainer; it takes the slot's work when "
                        "the trainer must be replaced (a restart starts no cold process)")
    p.add_argument("--on-job-complete", choices=ON_JOB_COMPLETE, default="exit",
                   help="when the job is COMPLETED (or FAILED): stop trainers and exit 0 (4 when FAILED), "
                        "or stop them and idle, or (pool) stop them and serve the next job that the "
                        "--controller address answers for (a node pool's DaemonSet: never gives up between jobs)")
    add_timeout_flags(p, environ)
    p.add_argument("--tls-ca-file", type=flags.existing_file,
                   help=f"CA of the controller's certificate: turns TLS on (default: env {dial.ENV_TLS_CA_FILE}; "
                        f"flags win)")
    p.add_argument("--tls-cert-file", type=flags.existing_file,
                   help=f"client certificate for mTLS (default: env {dial.ENV_TLS_CERT_FILE})")
    p.add_argument("--tls-key-file", type=flags.existing_file,
                   help=f"client key for mTLS (default: env {dial.ENV_TLS_KEY_FILE})")
    p.add_argument("--tls-server-name", help="name to check the controller's certificate "
                                              f"against (default: env {dial.ENV_TLS_SERVER_NAME}, else the "
                                              f"address's host)")
    p.add_argument("--job-secret-file", metavar="PATH", type=flags.existing_file,
                   help=f"file holding the job secret (a mounted Kubernetes Secret), handed to every trainer "
                        f"(default: env {job_secret.ENV_JOB_SECRET_FILE} / {job_secret.ENV_JOB_SECRET}; the flag "
                        f"wins)")
    p.add_argument("--insecure", action="store_true",
                   help=f"run without a job secret: trainers' ports without authentication "
                        f"({job_secret.ENV_INSECURE_TRAINER_PORTS}=1 in their environment); without a secret and "
                        f"without this flag the agent refuses to start")
    p.add_argument("--insecure-trainer-ports", dest="insecure", nargs=0, action=flags.Deprecated, default=False,
                   new="--insecure")
    p.add_argument("--telemetry-dir", default="",
                   help="directory for trainers' telemetry rings (default: empty, a fresh private one)")
    p.add_argument("--telemetry-window-collectives", type=int, default=32,
                   help="collectives per straggler window (the same on every agent of a job)")
    flags.add_log_level(p)
    return p


def parse(argv: list[str], environ: Mapping[str, str] | None = None) -> AgentSettings:
    """Settings from the command line (and the connect timeouts' variables in `environ`, by
    default this process's environment; flags win); raises ValueError naming a bad value."""
    environ = os.environ if environ is None else environ
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    p = parser(environ)
    args = p.parse_args(argv)
    secret = job_secret.from_env(file=args.job_secret_file)
    insecure = args.insecure or job_secret.insecure_from_env()
    tls = dial.TlsFiles.from_env(args.tls_ca_file, args.tls_cert_file, args.tls_key_file,
                                 args.tls_server_name)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format=f"%(asctime)s agent[{args.host_id}] %(levelname)s %(message)s")
    return AgentSettings(
        controller_addresses=tuple(args.controller), host_id=args.host_id,
        command=tuple(command), spare=args.spare, slots=args.slots, labels=args.labels,
        replica_id=args.replica_id, ranks=args.ranks, world_size=args.world_size,
        job_id=args.job_id, restart_budget=args.restart_budget,
        restart_window_s=args.restart_window_s, standby=args.standby, warm_restarts=args.warm_restarts,
        reserve_delay_s=args.reserve_delay_s,
        heartbeat_interval_s=args.heartbeat_interval_s, connect_timeout_s=args.connect_timeout_s,
        reconnect_timeout_s=args.reconnect_timeout_s,
        stop_grace_s=args.stop_grace_s, finish_grace_s=args.finish_grace_s, tls=tls,
        on_job_complete=args.on_job_complete, job_secret=secret,
        insecure_trainer_ports=insecure,
        telemetry_interval_s=args.telemetry_interval_s,
        telemetry_dir=args.telemetry_dir, telemetry_window_collectives=args.telemetry_window_collectives,
        advertise_address=args.advertise_address, rendezvous_port=args.rendezvous_port,
        coordinator_port=args.coordinator_port, state_dir=args.state_dir,
    ).validate()


async def _run(settings: AgentSettings) -> int:
    if settings.job_secret is None:
        log.warning("no job secret (--job-secret-file, %s or %s): trainers run their ports WITHOUT "
                    "authentication (--insecure)", job_secret.ENV_JOB_SECRET_FILE, job_secret.ENV_JOB_SECRET)
    agent = Agent(settings, base_env=_TRAINER_BASE_ENV)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    def stopping(sig: signal.Signals) -> None:
        agent.stop_reason = f"the agent got {sig.name}"
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping, sig)

    async def announce() -> None:
        await agent.registered.wait()
        a = agent.assignment
        print(json.dumps({"event": "registered", "host_id": settings.host_id,
                          "assignment": None if a is None else {
                              "replica_id": a.replica_id, "ranks": list(a.ranks),
                              "world_size": a.world_size},
                          "pid": os.getpid()}), flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await agent.run(stop)
    except PermanentError as exc:
        log.error("%s", exc)
        return 3
    except ConnectTimeout as exc:
        log.error("%s", exc)
        return EXIT_CONNECT_TIMEOUT
    finally:
        announcer.cancel()
    if agent.job_ending == "FAILED":
        log.error("stopped: the job FAILED")
        return EXIT_JOB_FAILED
    log.info("stopped")
    return 0


def main(argv: list[str]) -> int:
    try:
        settings = parse(argv)
    except ValueError as exc:
        print(f"fthsdp agent: {exc}", file=sys.stderr)
        return 2
    if settings.job_secret is None and not settings.insecure_trainer_ports:
        print(f"fthsdp agent: no job secret: give --job-secret-file PATH (or {job_secret.ENV_JOB_SECRET_FILE} / "
              f"{job_secret.ENV_JOB_SECRET}), the same on every agent of the job; or --insecure to run trainers' "
              f"ports without authentication", file=sys.stderr)
        return 2
    return asyncio.run(_run(settings))
