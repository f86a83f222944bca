"""The highly-available store: `controller.store.Store` on etcd v3 (client: aetcd).

Layout under `prefix` (no trailing slash needed):
    {prefix}/kv/{key}     the values; a value's revision is its etcd mod_revision
    {prefix}/leader       the election key: the leader's candidate name, attached to its lease

Election. `campaign` grants a lease of `ttl_s` (whole seconds, at least 1; etcd may raise it
to its minimum TTL) and creates the election key with it in one transaction that requires
the key to be absent (create_revision == 0). While the key exists the candidate polls it
every `poll_interval_s`. A winner's lease is kept alive by a task started in `campaign` (never
in the constructor) that refreshes every ttl/3 and checks that the election key is still its
own. `Leadership.lost` is set when the server says the lease is gone, when the key is no
longer ours, or when no refresh succeeded for a whole TTL (measured from the last successful
refresh's send time, so the local verdict comes no later than the server's expiry: this is
what deposes a leader whose process was stopped past its TTL).

Fencing. `cas` is one transaction: the key's mod_revision equals `expected_revision`
(create_revision == 0 when it is 0) AND the election key still has the create_revision,
value and lease this leadership created it with. A refused write whose leadership no longer
holds sets `lost`. A leadership that is locally lost, or past its deadline, is refused
without a round trip.

Security. `https://` endpoints, or a CA file, turn TLS on (the CA checks etcd's certificate;
a client certificate and key add mTLS); a user and password authenticate to etcd's auth (the
token etcd hands out is fetched again when etcd says it expired). aetcd 1.0 opens only
plaintext channels, so `_Client` opens the channel itself and leaves the rest to aetcd.

Errors. Every call is bounded by `op_timeout_s`; an unreachable or failing etcd raises
`StoreError`; a `cas` that raised may or may not have been applied, so re-read (`get`)
before deciding again. The client reconnects by itself (gRPC reconnect backoff capped by
`reconnect_backoff_max_s`), so after an etcd restart the same object works again. With several
endpoints, a connection failure moves the next call to the next endpoint. `campaign` retries
through outages (the caller bounds it); `resign` cleans up locally first and then raises
`StoreError` if the lease could not be revoked (it then expires by itself).

Fault injection for tests: `pause_keepalive(leadership)` stops refreshing, as a stalled
process would; `lost` is set when the TTL runs out and etcd then deletes the election key.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.transactions
import aetcd.watcher
import grpc

from controller.store import Leadership, StoreError, Versioned
from protos.dial import TlsFiles

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EtcdStoreSettings:
    """Client settings. Every etcd call is bounded by `op_timeout_s`."""

    op_timeout_s: float = 2.0
    """Upper bound of one etcd call (get, transaction, lease grant/refresh/revoke)."""
    poll_interval_s: float = 0.2
    """How often a campaigning candidate re-reads the election key, and how soon the
    keep-alive retries after a failed refresh."""
    reconnect_backoff_max_s: float = 1.0
    """Longest pause between gRPC reconnection attempts after etcd went away."""
    ca_file: str | None = None
    """PEM CA that signed etcd's server certificate: turns TLS on."""
    cert_file: str | None = None
    """PEM client certificate (with `key_file`) for etcd's --client-cert-auth."""
    key_file: str | None = None
    username: str | None = None
    """etcd user (with `password`) for etcd's auth; the password is never shown."""
    password: str | None = field(default=None, repr=False)

    def validate(self) -> None:
        for name in ("op_timeout_s", "poll_interval_s", "reconnect_backoff_max_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"EtcdStoreSettings.{name} must be a positive number of "
                                 f"seconds, got {value!r}.")
        self.tls_files().validate()
        if bool(self.username) != bool(self.password):
            raise ValueError(f"etcd auth needs both a user and a password, got user={self.username!r} "
                             f"and {'a' if self.password else 'no'} password.")

    def tls_files(self) -> TlsFiles:
        return TlsFiles(self.ca_file, self.cert_file, self.key_file, peer="etcd")


@dataclass
class _Fence:
    """What a leadership created: the election key's identity, its lease, its deadline."""

    election_key: bytes
    candidate: bytes
    lease_id: int
    create_revision: int
    deadline: float  # loop time by which a refresh must have succeeded
    keepalive_paused: bool = False
    task: asyncio.Task | None = field(default=None, repr=False)


class _LeaseCompare(aetcd.transactions.BaseCompare):
    """Compare on the key's lease id (etcd >= 3.3); aetcd has no helper for it."""

    def build_compare(self, compare):
        compare.target = aetcd.rpc.Compare.LEASE
        compare.lease = int(self.value)


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """"host:port", "http(s)://host:port" or "[::1]:port" -> (host, port)."""
    split = urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    if split.scheme not in ("", "http", "https"):
        raise ValueError(f"etcd endpoint {endpoint!r}: the scheme must be http or https.")
    if not split.hostname or split.port is None:
        raise ValueError(f"etcd endpoint {endpoint!r} must name a host and a port.")
    host = split.hostname
    return (f"[{host}]" if ":" in host else host), split.port


class _Client(aetcd.Client):
    """aetcd's client on a channel opened here: TLS when `credentials` are given (aetcd 1.0
    opens plaintext channels only), then etcd auth as aetcd does it."""

    def __init__(self, *, credentials: grpc.ChannelCredentials | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # another call is connecting: wait for it
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        self._is_connecting = True
        try:
            target, options = f"{self._host}:{self._port}", list(self._options.items())
            self.channel = (grpc.aio.secure_channel(target, self._credentials, options=options)
                            if self._credentials is not None else grpc.aio.insecure_channel(target, options=options))
            if self._username is not None:
                reply = await aetcd.rpc.AuthStub(self.channel).Authenticate(
                    aetcd.rpc.AuthenticateRequest(name=self._username, password=self._password),
                    timeout=self._timeout)
                self.metadata = (("token", reply.token),)
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(aetcd.rpc.WatchStub(self.channel), timeout=self._timeout,
                                                  metadata=self.metadata)
            self._connected.set()
        except BaseException:
            if self.channel is not None:
                await self.channel.close()
            self._init_channel_attrs()
            raise
        finally:
            self._is_connecting = False


_CONNECTION_ERRORS = (aetcd.exceptions.ConnectionFailedError,
                      aetcd.exceptions.ConnectionTimeoutError, asyncio.TimeoutError)


class EtcdStore:
    """`Store` on etcd. The constructor only records settings; nothing connects or runs
    until the first call."""

    def __init__(self, endpoints: list[str], prefix: str,
                 settings: EtcdStoreSettings | None = None) -> None:
        if not endpoints:
            raise ValueError("EtcdStore needs at least one endpoint, got none.")
        if not prefix:
            raise ValueError("EtcdStore needs a non-empty key prefix.")
        self.settings = settings or EtcdStoreSettings()
        self.settings.validate()
        self._addresses = [parse_endpoint(e) for e in endpoints]
        tls = self.settings.ca_file or any(e.startswith("https://") for e in endpoints)
        plain = [e for e in endpoints if e.startswith("http://")]
        if tls and plain:
            raise ValueError(f"etcd endpoints {plain} are plain http, but TLS is on (https endpoints or a CA file).")
        self._credentials = self.settings.tls_files().credentials() if tls else None
        self._prefix = prefix.rstrip("/")
        self._election_key = f"{self._prefix}/leader".encode()
        self._clients: list[aetcd.Client | None] = [None] * len(self._addresses)
        self._current = 0
        self._leaderships: list[Leadership] = []
        self._closed = False

    # -- plumbing ----------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        return f"{self._prefix}/kv/{key}".encode()

    def _client(self) -> aetcd.Client:
        if self._closed:
            raise StoreError("the etcd store is closed")
        index = self._current
        if self._clients[index] is None:
            host, port = self._addresses[index]
            backoff_ms = int(self.settings.reconnect_backoff_max_s * 1000)
            self._clients[index] = _Client(
                credentials=self._credentials, username=self.settings.username, password=self.settings.password,
                host=host, port=port, timeout=self.settings.op_timeout_s,
                connect_wait_timeout=self.settings.op_timeout_s,
                options={
                    # Reconnect soon after etcd comes back (gRPC's default backs off to 120 s).
                    "grpc.initial_reconnect_backoff_ms": min(100, backoff_ms),
                    "grpc.max_reconnect_backoff_ms": backoff_ms,
                    # Notice a dead connection (host gone, no RST) while calls are pending.
                    # etcd refuses pings more often than every 5 s, or without a call.
                    "grpc.keepalive_time_ms": 10_000,
                    "grpc.keepalive_timeout_ms": 5_000,
                })
        return self._clients[index]

    async def _call(self, what: str, make):
        """Run `make(client)` bounded by op_timeout_s; failures become StoreError. When etcd
        says the auth token expired, the client logs in again and the call is tried once more."""
        try:
            try:
                return await asyncio.wait_for(make(self._client()), self.settings.op_timeout_s)
            except aetcd.exceptions.UnauthenticatedError:
                if self.settings.username is None:
                    raise
                await self._drop_client()
                return await asyncio.wait_for(make(self._client()), self.settings.op_timeout_s)
        except grpc.aio.AioRpcError as error:  # raised by connect(): TLS handshake, wrong password
            raise StoreError(f"etcd {what} failed: {error.code().name}: {error.details()}") from error
        except _CONNECTION_ERRORS as error:
            if len(self._addresses) > 1:
                self._current = (self._current + 1) % len(self._addresses)
            raise StoreError(f"etcd {what} failed: {type(error).__name__}: {error}") from error
        except aetcd.exceptions.ClientError as error:
            raise StoreError(f"etcd {what} failed: {type(error).__name__}: {error}") from error

    # -- data --------------------------------------------------------------------------

    async def get(self, key: str) -> Versioned:
        kv = await self._call("get", lambda c: c.get(self._key(key)))
        return Versioned(None, 0) if kv is None else Versioned(kv.value, kv.mod_revision)

    async def cas(self, key: str, value: bytes, expected_revision: int,
                  leadership: Leadership) -> int | None:
        fence = leadership.fence
        if not isinstance(fence, _Fence) or leadership.lost.is_set():
            return None
        if asyncio.get_running_loop().time() >= fence.deadline:
            self._lose(leadership, "its lease deadline passed")
            return None
        k = self._key(key)
        t = aetcd.transactions
        guard = t.Create(k) == 0 if expected_revision == 0 else t.Mod(k) == expected_revision
        compare = [
            guard,
            t.Create(fence.election_key) == fence.create_revision,
            t.Value(fence.election_key) == fence.candidate,
            _LeaseCompare(fence.election_key) == fence.lease_id,
        ]
        ok, responses = await self._call("cas", lambda c: c.transaction(
            compare=compare, success=[t.Put(k, value), t.Get(k)],
            failure=[t.Get(fence.election_key)]))
        if ok:
            return responses[1][0][1].mod_revision
        if not self._still_ours(fence, responses[0]):
            self._lose(leadership, "the election key is no longer its own")
        return None

    async def _drop_client(self) -> None:
        client, self._clients[self._current] = self._clients[self._current], None
        if client is not None:
            try:
                await client.close()
            except Exception as error:  # noqa: BLE001 - closing a broken client must not hide the retry
                log.debug("closing the etcd client failed: %s", error)

    @staticmethod
    def _still_ours(fence: _Fence, range_kvs) -> bool:
        if not range_kvs:
            return False
        kv = range_kvs[0][1]
        return kv.create_revision == fence.create_revision and kv.lease == fence.lease_id

    # -- election ----------------------------------------------------------------------

    async def campaign(self, candidate: str, ttl_s: float) -> Leadership:
        ttl = max(1, math.ceil(ttl_s))
        outage_logged = False
        while True:
            try:
                current = await self._call("get", lambda c: c.get(self._election_key))
                if current is None:
                    won = await self._try_to_lead(candidate, ttl)
                    if won is not None:
                        return won
                outage_logged = False
            except StoreError as error:
                if not outage_logged:
                    log.warning("candidate %s cannot reach etcd, retrying: %s", candidate, error)
                    outage_logged = True
            await asyncio.sleep(self.settings.poll_interval_s)

    async def _try_to_lead(self, candidate: str, ttl: int) -> Leadership | None:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        lease = await self._call("lease grant", lambda c: c.lease(ttl))
        t = aetcd.transactions
        key, name = self._election_key, candidate.encode()
        try:
            ok, responses = await self._call("campaign", lambda c: c.transaction(
                compare=[t.Create(key) == 0],
                success=[t.Put(key, name, lease=lease.id), t.Get(key)], failure=[]))
        except BaseException:
            await self._revoke_quietly(lease.id)  # the put may have happened
            raise
        if not ok:
            await self._revoke_quietly(lease.id)
            return None
        kv = responses[1][0][1]
        fence = _Fence(key, name, lease.id, kv.create_revision, deadline=sent + lease.ttl)
        leadership = Leadership(candidate=candidate, fence=fence)
        fence.task = loop.create_task(self._keep_alive(leadership, fence, lease.ttl),
                                      name=f"etcd-keepalive-{candidate}")
        self._leaderships.append(leadership)
        log.info("candidate %s became leader (lease %x, ttl %s s)", candidate, lease.id, lease.ttl)
        return leadership

    async def _keep_alive(self, leadership: Leadership, fence: _Fence, ttl: int) -> None:
        try:
            await self._keep_alive_loop(leadership, fence, ttl)
        except Exception:  # a bug here must depose, never leave a leader without a lease
            log.exception("the lease keep-alive of %s failed", leadership.candidate)
            self._lose(leadership, "its lease keep-alive failed")
            await self._revoke_quietly(fence.lease_id)

    async def _keep_alive_loop(self, leadership: Leadership, fence: _Fence, ttl: int) -> None:
        loop = asyncio.get_running_loop()
        interval = ttl / 3
        while not leadership.lost.is_set():
            if loop.time() >= fence.deadline:
                self._lose(leadership, f"no lease refresh succeeded for {ttl} s")
                await self._revoke_quietly(fence.lease_id)
                return
            pause = interval
            if not fence.keepalive_paused:
                sent = loop.time()
                try:
                    # No call may outlive the deadline (op_timeout_s can be longer than the
                    # lease): the leader lets go on its own clock, before etcd expires the lease
                    # and elects another, however long a silent network holds the call.
                    reply = await self._by_deadline(fence, self._call(
                        "lease refresh", lambda c: c.refresh_lease(fence.lease_id)))
                    if reply is None or reply.TTL <= 0:
                        self._lose(leadership, "etcd says its lease expired")
                        return
                    fence.deadline = max(fence.deadline, sent + reply.TTL)
                    kv = await self._by_deadline(fence, self._call("get", lambda c: c.get(fence.election_key)))
                    if not self._still_ours(fence, [(None, kv)] if kv else []):
                        self._lose(leadership, "the election key is no longer its own")
                        return
                except StoreError as error:
                    log.debug("lease refresh for %s failed: %s", leadership.candidate, error)
                    pause = self.settings.poll_interval_s
                except asyncio.TimeoutError:
                    continue  # the deadline passed during the call: the check above lets go
            # Sleep, but wake at once when resign() sets `lost`: cancelling alone is not
            # enough, as asyncio.wait_for (3.11) can swallow a cancel that races a reply.
            lost = loop.create_task(leadership.lost.wait())
            pause = max(0.0, min(pause, fence.deadline - loop.time()))
            try:
                await asyncio.wait({lost}, timeout=pause)
            finally:
                lost.cancel()

    @staticmethod
    async def _by_deadline(fence: _Fence, call):
        """`call`, cancelled when the fence's deadline passes (asyncio.TimeoutError)."""
        return await asyncio.wait_for(call, max(0.0, fence.deadline - asyncio.get_running_loop().time()))

    def _lose(self, leadership: Leadership, reason: str) -> None:
        if not leadership.lost.is_set():
            log.warning("leader %s lost its leadership: %s", leadership.candidate, reason)
            leadership.lost.set()

    async def _revoke(self, lease_id: int) -> None:
        """Revoke a lease; one that etcd no longer knows counts as revoked."""
        try:
            await self._call("lease revoke", lambda c: c.revoke_lease(lease_id))
        except StoreError as error:
            if "lease not found" not in str(error):
                raise

    async def _revoke_quietly(self, lease_id: int) -> None:
        try:
            await self._revoke(lease_id)
        except StoreError as error:
            log.debug("lease %x not revoked (it will expire): %s", lease_id, error)

    async def leader(self) -> str | None:
        kv = await self._call("get", lambda c: c.get(self._election_key))
        return None if kv is None else kv.value.decode()

    async def resign(self, leadership: Leadership) -> None:
        fence = leadership.fence
        if not isinstance(fence, _Fence):
            return
        was_lost = leadership.lost.is_set()
        leadership.lost.set()
        self._leaderships = [held for held in self._leaderships if held is not leadership]
        task, fence.task = fence.task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if not was_lost:
            log.info("leader %s resigned", leadership.candidate)
        # Revoking deletes the election key at once, so a standby need not wait for the TTL.
        await self._revoke(fence.lease_id)

    async def close(self) -> None:
        for leadership in list(self._leaderships):
            try:
                await self.resign(leadership)
            except StoreError as error:
                log.warning("leader %s could not revoke its lease on close: %s",
                            leadership.candidate, error)
        self._closed = True
        clients, self._clients = self._clients, [None] * len(self._addresses)
        for client in clients:
            if client is not None:
                await client.close()

    # -- fault injection (tests) --------------------------------------------------------

    def pause_keepalive(self, leadership: Leadership, paused: bool = True) -> None:
        """Stop (or restart) refreshing this leadership's lease, as if the process had
        stalled; `lost` is then set once the TTL runs out."""
        fence = leadership.fence
        if isinstance(fence, _Fence):
            fence.keepalive_paused = paused
