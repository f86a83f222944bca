"""How agents and trainers dial the controller: TLS files, channels, failover order.

Both the agent and the trainer runtime dial the same controller the same way, and neither
may import the other, so this one small module sits beside the wire contract. It imports
nothing of ours but the generated stubs.

TLS material comes from files named by flags or by these environment variables (flags win):
FTHSDP_TLS_CA_FILE (the CA that signed the controller's certificate: turns TLS on),
FTHSDP_TLS_CERT_FILE and FTHSDP_TLS_KEY_FILE (a client certificate, for mTLS).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

ENV_CONTROLLER = "FTHSDP_CONTROLLER"
ENV_TLS_CA_FILE = "FTHSDP_TLS_CA_FILE"
ENV_TLS_CERT_FILE = "FTHSDP_TLS_CERT_FILE"
ENV_TLS_KEY_FILE = "FTHSDP_TLS_KEY_FILE"
ENV_TLS_SERVER_NAME = "FTHSDP_TLS_SERVER_NAME"


@dataclass(frozen=True)
class TlsFiles:
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    #: Name to check the controller's certificate against, when it differs from the address.
    server_name: str | None = None

    @classmethod
    def from_env(cls, ca_file=None, cert_file=None, key_file=None, server_name=None) -> "TlsFiles":
        env = os.environ.get
        return cls(ca_file or env(ENV_TLS_CA_FILE), cert_file or env(ENV_TLS_CERT_FILE),
                   key_file or env(ENV_TLS_KEY_FILE), server_name or env(ENV_TLS_SERVER_NAME)).validate()

    def validate(self) -> "TlsFiles":
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError(f"a client certificate needs both a cert and a key file, got cert={self.cert_file!r} "
                             f"key={self.key_file!r}.")
        if self.cert_file and not self.ca_file:
            raise ValueError("a client certificate needs TLS: name the controller's CA file too.")
        for path in (self.ca_file, self.cert_file, self.key_file):
            if path and not Path(path).is_file():
                raise ValueError(f"TLS file {path} does not exist.")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.ca_file)

    def credentials(self) -> grpc.ChannelCredentials:
        read = lambda p: Path(p).read_bytes() if p else None  # noqa: E731
        return grpc.ssl_channel_credentials(read(self.ca_file), read(self.key_file), read(self.cert_file))


def channel_options(tls: TlsFiles | None, max_message_bytes: int = 64 << 20) -> list[tuple[str, object]]:
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes),
               ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000)]
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return options


def aio_channel(address: str, tls: TlsFiles | None = None) -> grpc.aio.Channel:
    if tls is not None and tls.enabled:
        return grpc.aio.secure_channel(address, tls.credentials(), options=channel_options(tls))
    return grpc.aio.insecure_channel(address, options=channel_options(tls))


def sync_channel(address: str, tls: TlsFiles | None = None) -> grpc.Channel:
    if tls is not None and tls.enabled:
        return grpc.secure_channel(address, tls.credentials(), options=channel_options(tls))
    return grpc.insecure_channel(address, options=channel_options(tls))


def parse_addresses(text: str) -> list[str]:
    """`host:port[,host:port...]` (several controllers, or one Service address)."""
    addresses = [a.strip() for a in text.split(",") if a.strip()]
    if not addresses:
        raise ValueError(f"no controller address in {text!r}.")
    for a in addresses:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"controller address {a!r} is not host:port.")
    return addresses


def backoff_s(attempt: int, initial_s: float = 0.1, max_s: float = 5.0) -> float:
    """Delay before retry number `attempt` (0-based): doubling, capped."""
    return min(max_s, initial_s * (2 ** max(attempt, 0)))


#: gRPC codes that mean "this controller cannot answer now; another one may".
FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class FailoverChannel:
    """An asyncio client for several controller addresses (or one Service address).

    `call(method_name, request)` tries the current controller; on UNAVAILABLE (a standby,
    a dead or deposed leader, a refused connection) it moves to the next address with
    doubling backoff, until `total_timeout_s` is spent. Each attempt has its own deadline,
    so no call waits forever. Refusals such as INVALID_ARGUMENT are raised at once.
    """

    def __init__(self, addresses: list[str], tls: TlsFiles | None = None, *, attempt_timeout_s: float = 30.0,
                 total_timeout_s: float = 60.0, max_backoff_s: float = 0.5) -> None:
        self.addresses = list(addresses)
        self.max_backoff_s = max_backoff_s
        self.tls = tls
        self.attempt_timeout_s, self.total_timeout_s = attempt_timeout_s, total_timeout_s
        self.index = 0
        self._channel: grpc.aio.Channel | None = None
        self._stub = None

    @property
    def address(self) -> str:
        return self.addresses[self.index]

    def stub(self):
        from protos import controller_pb2_grpc

        if self._channel is None:
            self._channel = aio_channel(self.address, self.tls)
            self._stub = controller_pb2_grpc.ControllerStub(self._channel)
        return self._stub

    async def rotate(self) -> None:
        await self.close()
        self.index = (self.index + 1) % len(self.addresses)

    async def call(self, method: str, request, *, attempt_timeout_s: float | None = None):
        import asyncio
        import time

        deadline = time.monotonic() + self.total_timeout_s
        attempt = 0
        while True:
            timeout = min(attempt_timeout_s or self.attempt_timeout_s, max(deadline - time.monotonic(), 0.05))
            try:
                return await getattr(self.stub(), method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in FAILOVER_CODES or time.monotonic() >= deadline:
                    raise
            await self.rotate()
            delay = backoff_s(attempt // max(len(self.addresses), 1), max_s=self.max_backoff_s)
            await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            attempt += 1

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel, self._stub = self._channel, None, None
            await channel.close()
