"""`fthsdp controller`: run the quorum and recovery controller.

Flags win over the --settings JSON file, which wins over defaults. Secrets (tokens, keys)
come from files or the environment, never from the command line.

The job secret (--job-secret-file, else FTHSDP_JOB_SECRET_FILE, else FTHSDP_JOB_SECRET: the
same secret the agents and trainers hold) is what every caller proves (protos/credentials.py).
Without one the controller refuses to start, unless --insecure says that every claimed host
and replica id is to be believed (tests on one machine only).

A job id is never reused silently: on an etcd that holds --job-id finished, the controller
refuses (exit 2), or with --new-job serves the next free id (controller/core/job_ids.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from controller.settings import LR_POLICIES, ControllerSettings
from protos import cli_flags as flags
from protos import job_secret, timeout_rules
from protos.sync_modes import SYNC_MODES

ENV_ADMIN_TOKEN = "FTHSDP_ADMIN_TOKEN"
ENV_READ_TOKEN = "FTHSDP_READ_TOKEN"
ENV_ETCD_PASSWORD = "FTHSDP_ETCD_PASSWORD"
#: The flag that sets each listener's port (controller/service/server.py PortInUse.listener).
PORT_FLAGS = {"grpc": "--grpc-port", "http": "--http-port", "quorum": "--quorum-port"}
_DEFAULTS = ControllerSettings()
#: How long a starting controller waits for etcd to answer which jobs it holds.
STORE_WAIT_S = 60.0


def _add_security_flags(p: argparse.ArgumentParser) -> None:
    """TLS and authentication: to etcd, of callers, on the gRPC and REST ports."""
    f = flags.existing_file
    p.add_argument("--etcd-ca-file", type=f, help="PEM CA of etcd's server certificate: enables TLS to etcd "
                                                  "(default: none, plain TCP to etcd)")
    p.add_argument("--etcd-cert-file", type=f, help="PEM client certificate for etcd (mTLS; default: none)")
    p.add_argument("--etcd-key-file", type=f, help="PEM client key for etcd (mTLS; default: none)")
    p.add_argument("--etcd-user", help="etcd user (etcd auth); the password comes from --etcd-password-file "
                                       "(default: none, no etcd auth)")
    p.add_argument("--etcd-password-file", type=f,
                   help=f"file holding the etcd user's password (default: env {ENV_ETCD_PASSWORD})")
    p.add_argument("--store-max-request-bytes", type=int,
                   help=f"largest store write: etcd's --max-request-bytes (default {_DEFAULTS.store_max_request_bytes})")
    p.add_argument("--admin-token-file", type=f,
                   help=f"file holding the admin bearer token (default: env {ENV_ADMIN_TOKEN}; without one, "
                        f"writes are refused)")
    p.add_argument("--read-token-file", type=f,
                   help=f"file holding a token required for reads (default: env {ENV_READ_TOKEN}; without one, "
                        f"reads are open)")
    p.add_argument("--job-secret-file", metavar="PATH", type=f,
                   help=f"file holding the job secret that agents and replica coordinators prove (default: env "
                        f"{job_secret.ENV_JOB_SECRET_FILE} / {job_secret.ENV_JOB_SECRET}; the flag wins)")
    p.add_argument("--insecure", action="store_true",
                   help="run without a job secret: any caller may act for any host or replica it names")
    p.add_argument("--tls-cert-file", type=f, help="PEM server certificate: enables TLS on gRPC (default: none, "
                                                   "plain gRPC)")
    p.add_argument("--tls-key-file", type=f, help="PEM server private key (default: none)")
    p.add_argument("--tls-client-ca-file", type=f, help="PEM CA for client certificates: enables mTLS "
                                                        "(default: none)")
    p.add_argument("--bind-client-cert-to-host", metavar="RULE",
                   help="with mTLS: which certificate may act as which host id: 'exact' (a SAN DNS name, SAN "
                        "URI or the CN equals the host id) or a pattern with {host_id}, e.g. "
                        "'spiffe://example.com/agent/{host_id}' (default: none, any client certificate)")
    p.add_argument("--http-tls-cert-file", type=f,
                   help="PEM certificate: serves the REST API and /metrics over HTTPS (default: none, plain HTTP)")
    p.add_argument("--http-tls-key-file", type=f, help="PEM private key for --http-tls-cert-file (default: none)")


def add_timeout_flags(p: argparse.ArgumentParser) -> None:
    """The controller's timeout flags (also `fthsdp timeouts`'): each must keep the rules of
    protos/timeout_rules.py with the others (docs/operations.md, "Timeouts")."""
    d = ControllerSettings
    p.add_argument("--join-timeout-s", type=timeout_rules.seconds, metavar="S",
                   help=f"a quorum round waits this long for live replicas that have not joined, from its first "
                        f"joiner (default {d.join_timeout_s:g})")
    p.add_argument("--heartbeat-timeout-s", type=timeout_rules.seconds, metavar="S",
                   help=f"a replica coordinator or agent silent this long is declared dead (default "
                        f"{d.heartbeat_timeout_s:g}); at least 3 of the agents' and coordinators' heartbeat intervals")
    p.add_argument("--fail-after-s", type=timeout_rules.seconds, metavar="S",
                   help=f"the job becomes FAILED once no replica could make progress for this long (all DEAD on "
                        f"hosts that cannot run, no free spare; default {d.fail_after_s:g})")
    p.add_argument("--lease-ttl-s", type=timeout_rules.seconds, metavar="S",
                   help=f"leader lease in etcd (default {d.lease_ttl_s:g})")


def _add_layout_flags(p: argparse.ArgumentParser, d: ControllerSettings) -> None:
    """Where replicas run and how often a host's trainers may restart before it is replaced."""
    p.add_argument("--hosts-per-replica", type=int,
                   help=f"lay replicas out here: agents without an assignment get a free host slot "
                        f"(default {d.hosts_per_replica}: no layout, agents say their replica)")
    p.add_argument("--ranks-per-host", type=int,
                   help=f"ranks (GPUs) per host in that layout (default {d.ranks_per_host})")
    p.add_argument("--restart-budget", type=int,
                   help=f"replica restarts one host's trainer deaths may cause per --restart-window-s; "
                        f"the next death replaces the host by a spare (default {d.restart_budget})")
    p.add_argument("--restart-window-s", type=float,
                   help=f"the restart budget's window (default {d.restart_window_s:g})")


def parser() -> argparse.ArgumentParser:
    """The command line. Settings flags default to None ("not given": the --settings file or
    ControllerSettings decides); their help names ControllerSettings' default."""
    d = _DEFAULTS
    p = argparse.ArgumentParser(prog="fthsdp controller", description=__doc__.split("\n\n")[0],
                                formatter_class=flags.DefaultsFormatter)
    flags.add_version(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in a pod)")
    p.add_argument("--grpc-port", type=flags.port, default=50051,
                   help="gRPC port, 0..65535 (0 picks a free one); never shared: a port another process holds "
                        "is refused")
    p.add_argument("--http-port", type=flags.port, default=8080,
                   help="REST and /metrics port, 0..65535 (0 picks a free one); never shared")
    p.add_argument("--quorum-port", type=flags.port, default=0,
                   help="the replica coordinators' quorum port (framed joins on TCP, TLS with the gRPC TLS flags); "
                        "0 picks a free one; coordinators learn it from their first answer")
    p.add_argument("--no-quorum-port", action="store_true", help="no quorum port: coordinators use gRPC (QuorumStream, ReportStep)")
    p.add_argument("--settings", type=flags.existing_file, metavar="PATH",
                   help="JSON file with ControllerSettings fields; flags win over it (default: none, the "
                        "defaults shown here)")
    p.add_argument("--job-id", help=f"the job's id, unique per job (default {d.job_id!r}); a store that holds a "
                                    "finished job under it makes the controller refuse to start "
                                    "(controller/core/job_ids.py)")
    p.add_argument("--new-job", action="store_true",
                   help="when the store holds --job-id finished (COMPLETED or FAILED): serve the next free id "
                        "(ID-2, ID-3, ...) instead of refusing; the serving line and the log name it")
    p.add_argument("--replicas", type=int, help=f"configured replica count (default {d.replicas})")
    p.add_argument("--min-replicas", type=int,
                   help=f"fewest replicas a quorum may have (default {d.min_replicas})")
    add_timeout_flags(p)
    p.add_argument("--lr-policy", choices=LR_POLICIES,
                   help=f"how the learning rate scales with healthy/total replicas (default {d.lr_policy})")
    p.add_argument("--sync-mode", choices=SYNC_MODES,
                   help=f"how replicas meet: every step (sync) or every --sync-every inner steps "
                        f"(local_sgd, diloco, streaming_diloco); the trainers' FTHSDP_SYNC_MODE must agree "
                        f"(default {d.sync_mode})")
    p.add_argument("--sync-every", type=int, metavar="H",
                   help=f"inner steps between two syncs of the same parameters (local_sgd, diloco, "
                        f"streaming_diloco; default {d.sync_every_steps})")
    p.add_argument("--sync-fragments", type=int, metavar="F",
                   help=f"fragments the model is synced in, each every H inner steps on its own schedule "
                        f"(streaming_diloco; H a multiple of F); the trainers' FTHSDP_SYNC_FRAGMENTS must agree "
                        f"(default {d.sync_fragments})")
    _add_layout_flags(p, d)
    p.add_argument("--etcd", help="comma-separated etcd endpoints (host:port, http(s)://host:port); "
                                   "default: in-memory store")
    p.add_argument("--advertise-address",
                   help="host:port clients know this controller by; a standby names the leader's in its "
                        "refusals (default: the gRPC address it binds)")
    _add_security_flags(p)
    p.add_argument("--diagnosis-dry-run", action="store_true",
                   help="the diagnosis reports findings and the evictions it would make, and makes none")
    flags.add_log_level(p)
    p.add_argument("--event-log", default="stderr",
                   help="where the JSON event lines go: stderr, off, or a file path (appended)")
    p.add_argument("--event-log-level", default="INFO", choices=("INFO", "WARNING", "ERROR"),
                   help="the least level of event written (INFO: every event)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="no live goodput, failure histograms or event log (to measure their cost)")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


def _secret(path: str | None, env: str) -> str | None:
    if path:
        value = Path(path).read_text().strip()
        if not value:
            raise ValueError(f"secret file {path} is empty.")
        return value
    return os.environ.get(env) or None


def _http_tls(args) -> tuple[str, str] | None:
    if bool(args.http_tls_cert_file) != bool(args.http_tls_key_file):
        raise ValueError("--http-tls-cert-file and --http-tls-key-file go together.")
    for path in (args.http_tls_cert_file, args.http_tls_key_file):
        if path and not Path(path).is_file():
            raise ValueError(f"HTTP TLS file {path} does not exist.")
    return (args.http_tls_cert_file, args.http_tls_key_file) if args.http_tls_cert_file else None


def _etcd_store(args, job_id: str):
    from controller.etcd_store import EtcdStore, EtcdStoreSettings

    password = _secret(args.etcd_password_file, ENV_ETCD_PASSWORD)
    settings = EtcdStoreSettings(ca_file=args.etcd_ca_file, cert_file=args.etcd_cert_file,
                                 key_file=args.etcd_key_file, username=args.etcd_user,
                                 password=password if args.etcd_user else None)
    return EtcdStore(endpoints=args.etcd.split(","), prefix=f"/fthsdp/{job_id}", settings=settings)


async def _job_to_serve(args, asked: str) -> str:
    """The job id this controller serves (controller/core/job_ids.py): the one asked for unless
    the store holds it finished; ValueError when it must refuse. Reads the store's durable
    replicas section of each candidate in turn; an unreachable store is retried, bounded."""
    from controller.core.job_ids import MAX_CANDIDATES, candidates, choose_job_id, ending_of
    from controller.store import StoreError

    endings = []
    for job_id in candidates(asked, MAX_CANDIDATES if args.new_job else 1):
        store = _etcd_store(args, job_id)
        try:
            found = await _read_bounded(store, f"jobs/{job_id}/replicas", STORE_WAIT_S)
        except StoreError as exc:
            raise ValueError(f"cannot read job {job_id!r} from etcd {args.etcd} within {STORE_WAIT_S:g} s: {exc}")
        finally:
            await store.close()
        endings.append(ending_of(json.loads(found) if found else None))
        if endings[-1] is None:
            break
    choice = choose_job_id(asked, endings, args.new_job)
    if not choice.job_id:
        raise ValueError(choice.reason)
    log = logging.getLogger("fthsdp.controller")
    (log.warning if choice.job_id != asked else log.info)("%s", choice.reason)
    return choice.job_id


async def _read_bounded(store, key: str, bound_s: float) -> bytes | None:
    """store.get(key), retried every half second while the store cannot be reached, for at
    most `bound_s` (a controller may start before its etcd does)."""
    from controller.store import StoreError

    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while True:
        try:
            return (await asyncio.wait_for(store.get(key), max(deadline - loop.time(), 0.1))).value
        except (StoreError, asyncio.TimeoutError) as exc:
            if loop.time() >= deadline:
                raise StoreError(str(exc) or type(exc).__name__) from exc
            await asyncio.sleep(0.5)


def _credentials(args):
    import grpc

    if not args.tls_cert_file:
        if args.tls_key_file or args.tls_client_ca_file:
            raise ValueError("--tls-key-file and --tls-client-ca-file need --tls-cert-file.")
        return None
    if not args.tls_key_file:
        raise ValueError("--tls-cert-file needs --tls-key-file.")
    ca = Path(args.tls_client_ca_file).read_bytes() if args.tls_client_ca_file else None
    return grpc.ssl_server_credentials(
        [(Path(args.tls_key_file).read_bytes(), Path(args.tls_cert_file).read_bytes())],
        root_certificates=ca, require_client_auth=ca is not None)


def _quorum_tls(args):
    """The quorum port's TLS: the gRPC port's certificate and client CA (None without TLS)."""
    import ssl

    if not args.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.tls_cert_file, args.tls_key_file)
    if args.tls_client_ca_file:
        context.load_verify_locations(args.tls_client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _job_secret(args) -> job_secret.JobSecret | None:
    """The job secret; None only with --insecure (ValueError says what is missing)."""
    if args.insecure:
        logging.getLogger("fthsdp.controller").warning(
            "--insecure: no caller proves the job secret; anyone who reaches this controller may act for any "
            "host or replica")
        return None
    secret = job_secret.from_env(file=args.job_secret_file)
    if secret is None:
        raise ValueError(f"no job secret: give --job-secret-file PATH (or {job_secret.ENV_JOB_SECRET_FILE} / "
                         f"{job_secret.ENV_JOB_SECRET}), the secret the agents and trainers hold, so that only "
                         f"they may register hosts and lead replicas; or --insecure to believe every caller "
                         f"(tests on one machine only)")
    return secret


def build_server(args):
    from controller.service.server import ControllerServer

    settings = ControllerSettings.from_file(
        args.settings, job_id=args.job_id, replicas=args.replicas, min_replicas=args.min_replicas,
        join_timeout_s=args.join_timeout_s, heartbeat_timeout_s=args.heartbeat_timeout_s, lr_policy=args.lr_policy,
        sync_mode=args.sync_mode, sync_every_steps=args.sync_every, sync_fragments=args.sync_fragments,
        hosts_per_replica=args.hosts_per_replica, ranks_per_host=args.ranks_per_host,
        restart_budget=args.restart_budget, restart_window_s=args.restart_window_s,
        fail_after_s=args.fail_after_s,
        lease_ttl_s=args.lease_ttl_s, telemetry=False if args.no_telemetry else None,
        store_max_request_bytes=args.store_max_request_bytes, bind_client_cert_to_host=args.bind_client_cert_to_host)
    if args.diagnosis_dry_run:
        settings = replace(settings, diagnosis=replace(settings.diagnosis, dry_run=True)).validate()
    if settings.bind_client_cert_to_host and not args.tls_client_ca_file:
        raise ValueError("--bind-client-cert-to-host needs mTLS: give --tls-client-ca-file too.")
    if not args.etcd and (args.etcd_ca_file or args.etcd_cert_file or args.etcd_user):
        raise ValueError("the --etcd-* TLS and auth flags need --etcd.")
    secret = _job_secret(args)  # after the settings: their errors come first
    store = _etcd_store(args, settings.job_id) if args.etcd else None
    return ControllerServer(
        settings, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port, store=store,
        admin_token=_secret(args.admin_token_file, ENV_ADMIN_TOKEN),
        read_token=_secret(args.read_token_file, ENV_READ_TOKEN),
        grpc_credentials=_credentials(args), advertise_address=args.advertise_address, http_tls=_http_tls(args),
        quorum_port=None if args.no_quorum_port else args.quorum_port, quorum_tls=_quorum_tls(args),
        job_secret=secret)


async def serve(args) -> int:
    server = build_server(args)
    if args.etcd:  # a job id is never reused silently (controller/core/job_ids.py)
        job_id = await _job_to_serve(args, server.settings.job_id)
        if job_id != server.settings.job_id:
            args.job_id = job_id
            server = build_server(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(json.dumps({"event": "serving", "grpc": server.grpc_address, "http": server.http_url,
                      "quorum": server.quorum_address, "pid": os.getpid(), "candidate": server.candidate,
                      "job_id": server.settings.job_id}), flush=True)
    await stop.wait()
    await server.stop()
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from controller.service import event_log

    try:
        event_log.configure("off" if args.no_telemetry else args.event_log, args.event_log_level)
    except OSError as exc:
        print(f"fthsdp controller: cannot open --event-log {args.event_log}: {exc}", file=sys.stderr)
        return 2
    from controller.service.server import PortInUse

    try:
        return asyncio.run(serve(args))
    except PortInUse as exc:
        flag = PORT_FLAGS[exc.listener]
        why = "is already in use by another process" if exc.in_use else f"cannot be bound on {exc.host}: {exc.strerror}"
        print(f"fthsdp controller: {flag} {exc.port} {why}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        print(f"fthsdp controller: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
