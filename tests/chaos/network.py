"""A test network: hosts, controllers and etcd each in a network namespace of their own.

    with Network() as net:                        # needs root, iproute2 and nftables
        etcd, h0 = net.add("etcd"), net.add("h0") # a namespace each, an address each (10.77.0.x)
        with net.entered("etcd"):                 # this thread's sockets and children live there
            proc = subprocess.Popen([...])        # ...so etcd listens on etcd.address
        with net.observer():                      # the bridge's namespace reaches every node
            httpx.get(f"http://{etcd.address}:2379/health")
        net.faults.partition("h0")                # cut, slow, lose (tests/chaos/net_faults.py)
    # every namespace, link and rule of this run is gone, however the block ended

How it is built: one namespace holds a bridge (`br0`, address `OBSERVER_HOST` in the subnet:
the test process watches the job from there); every node is a namespace joined to the bridge by
a veth pair whose bridge end lives in the bridge's namespace and whose node end is `eth0` in the
node's namespace, with the node's address on it and `lo` up. The addresses (`SUBNET`) exist only
inside these namespaces: the host's own namespace gets no address, route or link, so nothing
here can send traffic anywhere but between the namespaces this run made. Processes join a
namespace by being started from a thread that entered it (`entered`): a child inherits its
parent thread's network namespace, so the helpers that start etcd, controllers and agents need
no wrapper and their PIDs are the real processes'.

Every name starts with `ftn<pid>-`, this process's id: `close()` (the context manager, and an
atexit hook for an exit that skips it) deletes this run's namespaces, and `remove_leftovers()`
deletes those of runs whose process is gone (a SIGKILLed test). Deleting a namespace deletes its
links (a veth pair goes with either end) and its nftables rules.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from typing import Iterator

from fthsdp.demo.procs import alive

SUBNET = "10.77.0"          # /24; nodes get .1 upwards, the observer (the bridge) .254
OBSERVER_HOST = 254
PREFIX = "ftn"              # namespaces: ftn<pid>-<name>
MAX_NODES = 200
_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_CLONE_NEWNET = 0x40000000
_COMMAND_TIMEOUT_S = 20.0
#: the commands a network needs, and the Debian package of each (`make test` installs them)
TOOLS = {"ip": "iproute2", "tc": "iproute2", "nft": "nftables", "iptables": "iptables"}


class NetworkError(RuntimeError):
    """A command that builds or changes the network failed; the message names it."""


def missing_tools() -> list[str]:
    """The Debian packages this helper needs that are not installed."""
    return sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})


def run(*argv: str, namespace: str = "", stdin: str | None = None) -> str:
    """Run an iproute2/nft command (in `namespace` when given); its output. NetworkError naming
    the command and its stderr when it fails; every call is bounded."""
    cmd = (["ip", "netns", "exec", namespace] if namespace else []) + list(argv)
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NetworkError(f"{' '.join(cmd)} did not finish within {_COMMAND_TIMEOUT_S:g}s") from None
    if done.returncode != 0:
        raise NetworkError(f"{' '.join(cmd)} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def entered_namespace(path: str) -> Iterator[None]:
    """This thread inside the network namespace at `path` (a /run/netns file) until the block
    ends, then back where it was. Sockets opened and processes started meanwhile stay there."""
    libc = _libc()
    with open("/proc/thread-self/ns/net") as home, open(path) as target:
        if libc.setns(target.fileno(), _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetworkError(f"setns into {path} failed: {os.strerror(err)}")
        try:
            yield
        finally:
            if libc.setns(home.fileno(), _CLONE_NEWNET) != 0:  # pragma: no cover - the kernel keeps its own ns
                raise NetworkError(f"setns back from {path} failed: {os.strerror(ctypes.get_errno())}")


@dataclass(frozen=True)
class Node:
    """One namespace on the bridge: a host (its agent and trainers), a controller or etcd."""
    name: str
    namespace: str
    address: str
    port: str        # the bridge's end of its veth pair (in the bridge's namespace)
    index: int


class Network:
    """Namespaces on one bridge; see the module docstring. Not thread-safe while being built."""

    def __init__(self) -> None:
        self.run_id = f"{PREFIX}{os.getpid()}"
        self.bridge_ns = f"{self.run_id}-br"
        self.nodes: dict[str, Node] = {}
        self._up = False
        self._lock = threading.Lock()
        from tests.chaos.net_faults import Faults  # the faults act on this network's bridge
        self.faults = Faults(self)

    # ------------------------------------------------------------------ life

    def __enter__(self) -> "Network":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "Network":
        missing = missing_tools()
        if missing:
            raise NetworkError(f"the test network needs {', '.join(missing)}: run 'apt-get install "
                               f"{' '.join(missing)}' as root (make test does)")
        if os.geteuid() != 0:
            raise NetworkError(f"the test network needs root (network namespaces); running as uid {os.geteuid()}")
        remove_leftovers()
        atexit.register(self.close)
        self._up = True
        try:
            run("ip", "netns", "add", self.bridge_ns)
            b = self.bridge_ns
            run("ip", "-n", b, "link", "set", "lo", "up")
            run("ip", "-n", b, "link", "add", "br0", "type", "bridge")
            run("ip", "-n", b, "addr", "add", f"{SUBNET}.{OBSERVER_HOST}/24", "dev", "br0")
            run("ip", "-n", b, "link", "set", "br0", "up")
            self.faults.install()
        except BaseException:
            self.close()
            raise
        return self

    def add(self, name: str) -> Node:
        """A new namespace `name` on the bridge, with the next address. ValueError names a bad
        or taken name; nothing is made then."""
        if not _NAME.match(name):
            raise ValueError(f"node name {name!r} must be a lowercase letter then up to 11 letters or digits")
        if name in self.nodes or name == "br":
            raise ValueError(f"node name {name!r} is taken in this network")
        if not self._up:
            raise NetworkError("the network is not started (use it as a context manager, or call start())")
        if len(self.nodes) >= MAX_NODES:
            raise ValueError(f"at most {MAX_NODES} nodes in one network")
        index = len(self.nodes) + 1
        node = Node(name, f"{self.run_id}-{name}", f"{SUBNET}.{index}", f"p{index}", index)
        b = self.bridge_ns
        run("ip", "netns", "add", node.namespace)
        self.nodes[name] = node
        run("ip", "-n", b, "link", "add", node.port, "type", "veth", "peer", "name", "eth0", "netns", node.namespace)
        run("ip", "-n", b, "link", "set", node.port, "master", "br0")
        run("ip", "-n", b, "link", "set", node.port, "up")
        n = node.namespace
        run("ip", "-n", n, "link", "set", "lo", "up")
        run("ip", "-n", n, "addr", "add", f"{node.address}/24", "dev", "eth0")
        run("ip", "-n", n, "link", "set", "eth0", "up")
        return node

    def close(self) -> None:
        """Delete every namespace of this run (their links and rules go with them); idempotent."""
        with self._lock:
            if not self._up:
                return
            self._up = False
        for name in [*(n.namespace for n in self.nodes.values()), self.bridge_ns]:
            _delete_namespace(name)
        self.nodes.clear()
        atexit.unregister(self.close)

    # ------------------------------------------------------------------ use

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise ValueError(f"no node {name!r} in this network (nodes: {sorted(self.nodes)})") from None

    def entered(self, name: str):
        """This thread inside node `name`'s namespace for the block (see `entered_namespace`)."""
        return entered_namespace(f"/run/netns/{self.node(name).namespace}")

    def observer(self):
        """This thread inside the bridge's namespace, which reaches every node's address."""
        return entered_namespace(f"/run/netns/{self.bridge_ns}")

    def namespaces(self) -> list[str]:
        return [self.bridge_ns, *(n.namespace for n in self.nodes.values())]

    def pids(self) -> dict[str, list[int]]:
        """node -> the processes running in its namespace now (only those with any)."""
        out = {}
        for node in self.nodes.values():
            found = [int(p) for p in run("ip", "netns", "pids", node.namespace).split()]
            if found:
                out[node.name] = found
        return out


def _delete_namespace(name: str) -> None:
    with contextlib.suppress(NetworkError):
        run("ip", "netns", "delete", name)


def _run_pid(namespace: str) -> int | None:
    m = re.match(rf"^{PREFIX}(\d+)-", namespace)
    return int(m.group(1)) if m else None


def ours(namespaces: list[str]) -> list[str]:
    """The namespaces among `namespaces` that some run of this helper made."""
    return [n for n in namespaces if _run_pid(n) is not None]


def list_namespaces() -> list[str]:
    return [line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip()]


def remove_leftovers() -> list[str]:
    """Delete the namespaces of runs whose process has gone (a killed test left them); returns them."""
    gone = []
    for name in ours(list_namespaces()):
        pid = _run_pid(name)
        if pid is not None and not alive(pid):
            _delete_namespace(name)
            gone.append(name)
    return gone
