"""The slowed link between replicas of bench.semisync: a real one where the machine allows, else a token bucket.

    link = open_link("auto", replicas=2, rate_mb_s=50)   # "veth", "bucket" or "auto"
    with link.entered(link.controller_node):           # the controller (and torchft's lighthouse) start here
        ...
    with link.entered(link.replica_node(0)):           # replica 0's trainer process starts here
        ...                                            # it binds link.replica_host(0)
    link.close()

- `VethLink` (root, iproute2 and nftables; tests/chaos/network.py builds it): every replica's
  trainer process lives in a network namespace of its own, joined by a veth pair to one bridge,
  and a tbf qdisc caps the replica's link at the stated rate each way (tests/chaos/net_faults.py
  `bandwidth`). Every byte between replicas -- our FTAR and torchft's Gloo alike -- crosses it;
  the controller and torchft's lighthouse sit in a namespace of their own, uncapped
  (their traffic is a few hundred bytes per sync). `wire_bytes(i)` is what replica i's end sent
  (the interface's counter: payload, TCP/IP headers, control traffic, all of it).
- `BucketLink` (the fallback): everything on loopback; each trainer paces its own FTAR sends by a
  token bucket in the transport (`Pacer`), so only our FTAR traffic is slowed, not torchft's.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

#: what `open_link` accepts
KINDS = ("auto", "veth", "bucket")


class Pacer:
    """A token bucket of `rate` bytes/s without burst: sends of every connection of one endpoint
    leave one after the other at that rate (the replica's uplink). `rate` 0 only counts."""

    def __init__(self, rate_bytes_s: float) -> None:
        self.rate, self.sent = rate_bytes_s, 0
        self._lock, self._free_at = threading.Lock(), 0.0

    def take(self, n: int) -> None:
        with self._lock:
            self.sent += n
            if self.rate <= 0:
                return
            now = time.monotonic()
            self._free_at = max(now, self._free_at) + n / self.rate
            ready = self._free_at
        while (left := ready - time.monotonic()) > 0:
            time.sleep(left)


def paced_transport(pacer: Pacer, buffer_bytes: int):
    """An FTAR transport whose every send first takes its bytes from `pacer`."""
    from ftar_kernels.transport import TcpTransport, WrappedConnection, WrappedTransport

    class PacedConnection(WrappedConnection):
        def send_all(self, data, timeout_s: float) -> None:
            pacer.take(len(data))
            self.inner.send_all(data, timeout_s)

        def try_send(self, data) -> int:
            if pacer.rate > 0:
                return 0  # paced: FTAR's sender thread waits for the bucket (send_all), then sends
            taken = self.inner.try_send(data)
            pacer.take(taken)  # counts only
            return taken

    return WrappedTransport(TcpTransport(buffer_bytes), PacedConnection)


class BucketLink:
    """Loopback; each trainer paces its FTAR sends itself (`bucket_bytes_s`)."""

    kind = "bucket"
    controller_node = "ctl"

    def __init__(self, replicas: int, rate_mb_s: float, why: str = "") -> None:
        self.replicas, self.rate_mb_s = replicas, rate_mb_s
        self.bucket_bytes_s = rate_mb_s * 1e6
        self.caps_torchft = rate_mb_s <= 0  # nothing to cap: the plain link is the same for both
        paced = (f"token bucket in the FTAR transport (bench/semisync_link.py Pacer), {rate_mb_s:g} MB/s per replica"
                 if rate_mb_s > 0 else "unpaced loopback")
        self.name = paced + (f" (no veth: {why})" if why else "")

    def replica_node(self, i: int) -> str:
        return f"r{i}"

    def replica_host(self, i: int) -> str:
        return "127.0.0.1"

    @property
    def controller_host(self) -> str:
        return "127.0.0.1"

    def entered(self, node: str):
        return contextlib.nullcontext()

    def gloo_interface(self) -> str:
        return "lo"

    def wire_bytes(self, i: int) -> int | None:
        return None  # loopback is shared by everyone: no per-replica counter

    def close(self) -> None:
        pass


class VethLink:
    """A namespace per replica on one bridge, each replica's veth capped by tbf (module docstring)."""

    kind = "veth"
    controller_node = "ctl"

    def __init__(self, replicas: int, rate_mb_s: float) -> None:
        from tests.chaos.network import Network

        self.replicas, self.rate_mb_s = replicas, rate_mb_s
        self.bucket_bytes_s = 0.0  # the trainers count their FTAR bytes but do not pace them
        self.caps_torchft = True
        self.net = Network().start()
        try:
            self.net.add(self.controller_node)
            for i in range(replicas):
                self.net.add(self.replica_node(i))
                if rate_mb_s > 0:
                    self.net.faults.bandwidth(self.replica_node(i), max(8, round(rate_mb_s * 8000)))
        except BaseException:
            self.net.close()
            raise
        self.name = (f"veth+tbf {rate_mb_s:g}MB/s" if rate_mb_s > 0 else "veth (uncapped)")

    def replica_node(self, i: int) -> str:
        return f"r{i}"

    def replica_host(self, i: int) -> str:
        return self.net.node(self.replica_node(i)).address

    @property
    def controller_host(self) -> str:
        return self.net.node(self.controller_node).address

    def entered(self, node: str):
        return self.net.entered(node)

    def gloo_interface(self) -> str:
        return "eth0"

    def wire_bytes(self, i: int) -> int | None:
        from tests.chaos.network import run

        info = json.loads(run("ip", "-s", "-j", "link", "show", "eth0", namespace=self.net.node(self.replica_node(i)).namespace))
        return int(info[0]["stats64"]["tx"]["bytes"])

    def close(self) -> None:
        self.net.close()


def veth_unavailable() -> str:
    """Why this machine cannot build the veth link ("" when it can)."""
    from tests.chaos.network import missing_tools

    if os.geteuid() != 0:
        return f"network namespaces need root, this is uid {os.geteuid()}"
    missing = missing_tools()
    return f"missing {', '.join(missing)}" if missing else ""


def open_link(kind: str, replicas: int, rate_mb_s: float) -> BucketLink | VethLink:
    """The link `kind` asks for; "auto" takes veth where the machine allows. ValueError names a
    kind that is not one of KINDS, or veth asked for where it cannot be built."""
    if kind not in KINDS:
        raise ValueError(f"--link must be one of {', '.join(KINDS)}, got {kind!r}")
    why = veth_unavailable() if kind != "bucket" else ""
    if kind == "veth" and why:
        raise ValueError(f"--link veth cannot be built here: {why} (use --link bucket or auto)")
    if kind == "bucket" or why:
        return BucketLink(replicas, rate_mb_s, why)
    return VethLink(replicas, rate_mb_s)
