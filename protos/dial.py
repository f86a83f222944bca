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
#: How long an agent or a trainer's rank 0 tries to reach a controller before it gives up: for
#: a first connection that never got an answer (a wrong address shows soon), and again after
#: one did (a controller failover or restart takes a while). Flags win over these variables.
ENV_CONNECT_TIMEOUT_S = "FTHSDP_CONNECT_TIMEOUT_S"
ENV_RECONNECT_TIMEOUT_S = "FTHSDP_RECONNECT_TIMEOUT_S"
CONNECT_TIMEOUT_S = 60.0
RECONNECT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class TlsFiles:
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    #: Name to check the controller's certificate against, when it differs from the address.
    server_name: str | None = None
    #: Whom these files are for, in error messages (the controller's store uses them for etcd).
    peer: str = "the controller"

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
            raise ValueError(f"a client certificate needs TLS: name {self.peer}'s CA file too.")
        for path in (self.ca_file, self.cert_file, self.key_file):
            if path and not Path(path).is_file():
                raise ValueError(f"TLS file {path} does not exist (TLS to {self.peer}).")
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
    return min(max_s, initial_s * (2 ** min(max(attempt, 0), 30)))


#: gRPC codes that mean "this controller cannot answer now; another one may".
FAILOVER_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
#: Trailing metadata of a standby's refusal: the leader's address, when the standby knows it.
LEADER_METADATA_KEY = "fthsdp-leader"


def leader_hint(error: grpc.RpcError) -> str:
    """The leader's address named by a refusing standby, or ""."""
    try:
        metadata = error.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - an error without metadata (e.g. a local one) names nobody
        return ""
    return next((str(value) for key, value in metadata if key == LEADER_METADATA_KEY), "")


class AddressRotation:
    """Which controller to try next, and how long to wait first: the failover rule that
    agents and trainers share. Pure: no clock, no I/O, no randomness (jitter is passed in).

    After a failure ("not leader", unreachable, no answer in time) the next address is tried
    at once, or the leader a standby named (`hint`), if it is one of the configured
    addresses (a hint never leads a client anywhere else). Only after a whole pass of
    failures, as many attempts as there are addresses, comes a pause: base_s, doubling per
    failed pass, capped at cap_s (shortened by the jitter fraction). A success ends the
    outage; the next one starts with an immediate pass again.
    """

    def __init__(self, addresses, *, base_s: float, cap_s: float) -> None:
        self.addresses = list(addresses)
        if not self.addresses:
            raise ValueError("AddressRotation needs at least one address, got none.")
        if not 0 < base_s <= cap_s:
            raise ValueError(f"backoff needs 0 < base_s <= cap_s, got base_s={base_s} cap_s={cap_s}.")
        self.base_s, self.cap_s = base_s, cap_s
        self.index = 0
        #: attempts failed in the current pass, and passes failed in this outage
        self.failed_in_pass = 0
        self.failed_passes = 0

    @property
    def current(self) -> str:
        return self.addresses[self.index]

    def succeeded(self) -> None:
        self.failed_in_pass = self.failed_passes = 0

    def failed(self, hint: str = "", jitter: float = 0.0) -> float:
        """Move to the next address to try; return how long to wait before trying it."""
        if hint in self.addresses and hint != self.current:
            self.index = self.addresses.index(hint)
        else:
            self.index = (self.index + 1) % len(self.addresses)
        self.failed_in_pass += 1
        if self.failed_in_pass < len(self.addresses):
            return 0.0
        self.failed_in_pass = 0
        delay = backoff_s(self.failed_passes, self.base_s, self.cap_s)
        self.failed_passes += 1
        return delay * (1.0 - min(max(jitter, 0.0), 0.99))


class Outage:
    """Connection attempts that got no answer from any controller since the last one that did:
    when to say so and when to give up. Pure (time passed in); the agent and the trainer
    runtime follow it alike.

    A client that never had an answer gives up once the next pause would take the outage past
    `connect_timeout_s` (a wrong address or a missing controller is a configuration error: say
    so soon); one that had an answer waits `reconnect_timeout_s` (a failover, a restarted
    controller). Failed attempts are logged once per doubling of their count (the 1st, 2nd,
    4th, 8th...): a few lines, each with the address and the reason, never one per attempt.
    """

    def __init__(self, connect_timeout_s: float, reconnect_timeout_s: float) -> None:
        self.connect_timeout_s, self.reconnect_timeout_s = connect_timeout_s, reconnect_timeout_s
        #: when the outage began (None: the last attempt was answered), and its failed attempts
        self.since: float | None = None
        self.attempts = 0
        #: a controller answered once: outages from now on are reconnections
        self.answered = False

    @property
    def limit_s(self) -> float:
        return self.reconnect_timeout_s if self.answered else self.connect_timeout_s

    @property
    def limit_name(self) -> str:
        """The setting that bounds this outage (for messages)."""
        return "reconnect timeout" if self.answered else "connect timeout"

    def failed(self, now: float, pause_s: float) -> bool:
        """One more attempt failed at `now`, the next one `pause_s` later: True to give up."""
        self.since = now if self.since is None else self.since
        self.attempts += 1
        return now - self.since + pause_s > self.limit_s

    @property
    def worth_a_line(self) -> bool:
        """Whether the attempt just failed is logged: the 1st, 2nd, 4th, 8th... of the outage."""
        return self.attempts > 0 and self.attempts & (self.attempts - 1) == 0

    def length(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since

    def succeeded(self) -> None:
        self.since, self.attempts, self.answered = None, 0, True


class FailoverChannel:
    """An asyncio client for several controller addresses (or one Service address).

    `call(method_name, request)` tries the current controller; on UNAVAILABLE (a standby,
    a dead or deposed leader, a refused connection) or DEADLINE_EXCEEDED it moves on as
    `AddressRotation` says (the leader a standby names, else the next address; a pause only
    after a whole pass), until `total_timeout_s` is spent. Each attempt has its own deadline,
    so no call waits forever. Refusals such as INVALID_ARGUMENT are raised at once.
    """

    def __init__(self, addresses: list[str], tls: TlsFiles | None = None, *, attempt_timeout_s: float = 30.0,
                 total_timeout_s: float = 60.0, max_backoff_s: float = 0.5) -> None:
        self.rotation = AddressRotation(addresses, base_s=min(0.1, max_backoff_s), cap_s=max_backoff_s)
        self.addresses = self.rotation.addresses
        self.tls = tls
        self.attempt_timeout_s, self.total_timeout_s = attempt_timeout_s, total_timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub = None

    @property
    def index(self) -> int:
        return self.rotation.index

    @index.setter
    def index(self, value: int) -> None:
        self.rotation.index = value % len(self.addresses)

    @property
    def address(self) -> str:
        return self.rotation.current

    def stub(self):
        from protos import controller_pb2_grpc

        if self._channel is None:
            self._channel = aio_channel(self.address, self.tls)
            self._stub = controller_pb2_grpc.ControllerStub(self._channel)
        return self._stub

    async def call(self, method: str, request, *, attempt_timeout_s: float | None = None):
        import asyncio
        import random
        import time

        deadline = time.monotonic() + self.total_timeout_s
        while True:
            timeout = min(attempt_timeout_s or self.attempt_timeout_s, max(deadline - time.monotonic(), 0.05))
            try:
                answer = await getattr(self.stub(), method)(request, timeout=timeout)
                self.rotation.succeeded()
                return answer
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in FAILOVER_CODES or time.monotonic() >= deadline:
                    raise
                hint = leader_hint(exc)
            await self.close()
            delay = self.rotation.failed(hint, jitter=random.random() * 0.5)
            if delay:
                await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0)))

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel, self._stub = self._channel, None, None
            await channel.close()
