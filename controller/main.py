"""`fthsdp controller`: run the quorum and recovery controller.

Flags win over the --settings JSON file, which wins over defaults. Secrets (tokens, keys)
come from files or the environment, never from the command line.

The job secret (--job-secret-file, else FTHSDP_JOB_SECRET_FILE, else FTHSDP_JOB_SECRET: the
same secret the agents and trainers hold) is what every caller proves (protos/credentials.py).
Without one the controller refuses to start, unless --insecure says that every claimed host
and replica id is to be believed (tests on one machine only).
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
from protos import job_secret
from protos.sync_modes import SYNC_MODES

ENV_ADMIN_TOKEN = "FTHSDP_ADMIN_TOKEN"
ENV_READ_TOKEN = "FTHSDP_READ_TOKEN"
ENV_ETCD_PASSWORD = "FTHSDP_ETCD_PASSWORD"


def _add_security_flags(p: argparse.ArgumentParser) -> None:
    """TLS and authentication: to etcd, of callers, on the gRPC and REST ports."""
    p.add_argument("--etcd-ca-file", help="PEM CA of etcd's server certificate: enables TLS to etcd")
    p.add_argument("--etcd-cert-file", help="PEM client certificate for etcd (mTLS)")
    p.add_argument("--etcd-key-file", help="PEM client key for etcd (mTLS)")
    p.add_argument("--etcd-user", help="etcd user (etcd auth); the password comes from --etcd-password-file")
    p.add_argument("--etcd-password-file", help=f"file holding the etcd user's password (or env {ENV_ETCD_PASSWORD})")
    p.add_argument("--store-max-request-bytes", type=int,
                   help="largest store write: etcd's --max-request-bytes (default 1572864)")
    p.add_argument("--admin-token-file", help=f"file holding the admin bearer token (or env {ENV_ADMIN_TOKEN})")
    p.add_argument("--read-token-file", help=f"file holding a token required for reads (or env {ENV_READ_TOKEN})")
    p.add_argument("--job-secret-file", metavar="PATH",
                   help=f"file holding the job secret that agents and replica coordinators prove (or env "
                        f"{job_secret.ENV_JOB_SECRET_FILE} / {job_secret.ENV_JOB_SECRET}; the flag wins)")
    p.add_argument("--insecure", action="store_true",
                   help="run without a job secret: any caller may act for any host or replica it names")
    p.add_argument("--tls-cert-file", help="PEM server certificate: enables TLS on gRPC")
    p.add_argument("--tls-key-file", help="PEM server private key")
    p.add_argument("--tls-client-ca-file", help="PEM CA for client certificates: enables mTLS")
    p.add_argument("--bind-client-cert-to-host", metavar="RULE",
                   help="with mTLS: which certificate may act as which host id: 'exact' (a SAN DNS name, SAN "
                        "URI or the CN equals the host id) or a pattern with {host_id}, e.g. "
                        "'spiffe://example.com/agent/{host_id}'")
    p.add_argument("--http-tls-cert-file", help="PEM certificate: serves the REST API and /metrics over HTTPS")
    p.add_argument("--http-tls-key-file", help="PEM private key for --http-tls-cert-file")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fthsdp controller", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 in a pod)")
    p.add_argument("--grpc-port", type=int, default=50051, help="gRPC port; 0 picks a free one")
    p.add_argument("--http-port", type=int, default=8080, help="REST and /metrics port; 0 picks a free one")
    p.add_argument("--quorum-port", type=int, default=0,
                   help="the replica coordinators' quorum port (framed joins on TCP, TLS with the gRPC TLS flags); "
                        "0 picks a free one (default); coordinators learn it from their first answer")
    p.add_argument("--no-quorum-port", action="store_true", help="no quorum port: coordinators use gRPC (QuorumStream, ReportStep)")
    p.add_argument("--settings", help="JSON file with ControllerSettings fields")
    p.add_argument("--job-id")
    p.add_argument("--replicas", type=int, help="configured replica count")
    p.add_argument("--min-replicas", type=int)
    p.add_argument("--join-timeout-s", type=float)
    p.add_argument("--heartbeat-timeout-s", type=float)
    p.add_argument("--lr-policy", choices=LR_POLICIES)
    p.add_argument("--sync-mode", choices=SYNC_MODES,
                   help="how replicas meet: every step (sync, the default) or every --sync-every inner steps "
                        "(local_sgd, diloco); the trainers' FTHSDP_SYNC_MODE must agree")
    p.add_argument("--sync-every", type=int, metavar="H", help="inner steps between two syncs (local_sgd, diloco)")
    p.add_argument("--hosts-per-replica", type=int,
                   help="lay replicas out here: agents without an assignment get a free host slot")
    p.add_argument("--ranks-per-host", type=int, help="ranks (GPUs) per host in that layout")
    p.add_argument("--restart-budget", type=int,
                   help="replica restarts one host's trainer deaths may cause per --restart-window-s; "
                        "the next death replaces the host by a spare (default 3)")
    p.add_argument("--restart-window-s", type=float, help="the restart budget's window (default 300)")
    p.add_argument("--fail-after-s", type=float,
                   help="the job becomes FAILED once no replica could make progress for this long (all DEAD on "
                        "hosts that cannot run, no free spare; default 300)")
    p.add_argument("--etcd", help="comma-separated etcd endpoints (host:port, http(s)://host:port); "
                                   "default: in-memory store")
    p.add_argument("--lease-ttl-s", type=float, help="leader lease in etcd (default 5)")
    p.add_argument("--advertise-address",
                   help="host:port clients know this controller by; a standby names the leader's in its "
                        "refusals (default: the gRPC address it binds)")
    _add_security_flags(p)
    p.add_argument("--diagnosis-dry-run", action="store_true",
                   help="the diagnosis reports findings and the evictions it would make, and makes none")
    p.add_argument("--log-level", default="INFO", help="the text log on stderr")
    p.add_argument("--event-log", default="stderr",
                   help="where the JSON event lines go: stderr (default), off, or a file path (appended)")
    p.add_argument("--event-log-level", default="INFO", choices=("INFO", "WARNING", "ERROR"),
                   help="the least level of event written (default INFO: every event)")
    p.add_argument("--no-telemetry", action="store_true",
                   help="no live goodput, failure histograms or event log (to measure their cost)")
    return p.parse_args(argv)


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
        sync_mode=args.sync_mode, sync_every_steps=args.sync_every, hosts_per_replica=args.hosts_per_replica, ranks_per_host=args.ranks_per_host,
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    print(json.dumps({"event": "serving", "grpc": server.grpc_address, "http": server.http_url,
                      "quorum": server.quorum_address, "pid": os.getpid(), "candidate": server.candidate}), flush=True)
    await stop.wait()
    await server.stop()
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from controller.service import event_log

    try:
        event_log.configure("off" if args.no_telemetry else args.event_log, args.event_log_level)
    except OSError as exc:
        print(f"fthsdp controller: cannot open --event-log {args.event_log}: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(args))
    except (ValueError, OSError) as exc:
        print(f"fthsdp controller: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
