"""fthsdp-grpc-health: ask a gRPC health service whether it is SERVING, over TLS if asked.

Kubelet's native gRPC probe speaks plaintext only; with mTLS on the controller's port the
production overlay runs this as an exec readiness probe instead. Exit status 0 when the
service answers SERVING, 1 otherwise (NOT_SERVING, unreachable, timeout, bad TLS), 2 on
bad usage. Installed into the controller image as /usr/local/bin/fthsdp-grpc-health.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def check(addr: str, service: str = "", timeout_s: float = 2.0, ca_file: str | None = None,
          cert_file: str | None = None, key_file: str | None = None,
          server_name: str | None = None) -> tuple[bool, str]:
    """One health check. Returns (serving, a line saying what was seen)."""
    if ca_file is None:
        channel = grpc.insecure_channel(addr)
    else:
        creds = grpc.ssl_channel_credentials(_read(ca_file), _read(key_file), _read(cert_file))
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
        channel = grpc.secure_channel(addr, creds, options=options)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as err:
            return False, f"{addr} health check of {service!r} failed: {err.code().name} {err.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{addr} {service!r} is {status}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fthsdp-grpc-health", description=__doc__.split("\n")[0])
    parser.add_argument("--addr", required=True, help="host:port")
    parser.add_argument("--service", default="", help="health service name ('' = the server)")
    parser.add_argument("--timeout-s", type=float, default=2.0)
    parser.add_argument("--ca-file")
    parser.add_argument("--cert-file")
    parser.add_argument("--key-file")
    parser.add_argument("--server-name", help="name to verify in the server certificate")
    args = parser.parse_args(argv)
    if (args.cert_file is None) != (args.key_file is None):
        parser.error("--cert-file and --key-file go together")
    if args.cert_file and not args.ca_file:
        parser.error("--cert-file needs --ca-file")
    serving, line = check(args.addr, args.service, args.timeout_s, args.ca_file, args.cert_file,
                          args.key_file, args.server_name)
    print(line, file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
