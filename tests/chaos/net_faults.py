"""Faults of the test network (tests/chaos/network.py): each injected, healed, and recorded.

    fid = net.faults.partition("h1")                 # h1 and every other node: nothing passes
    fid = net.faults.cut("h1", ["h0"])               # h1 <-> h0 only (h1 still reaches the controllers)
    fid = net.faults.cut("ca", ["etcd"])             # a controller cut from etcd, agents still reach it
    fid = net.faults.loss("h1", 3)                   # 3 % of h1's packets, each way, dropped
    fid = net.faults.bandwidth("h1", 2000)           # h1's link capped at 2000 kbit/s each way (tbf)
    fid = net.faults.delay("h1", 100, 20)            # what h1 sends waits 100 +- 20 ms
    net.faults.heal(fid)                             # undone; net.faults.records says when each began and ended
    env = skewed_clock(400)                          # a process started with env sees its clock 400 s ahead

How each is made, and why that way:
- cuts and loss are nftables rules in the *bridge's* namespace (family `bridge`, the forward
  hook): a packet between two nodes is dropped in transit, as a broken link or switch drops it.
  Neither end's stack is touched, so senders see silence (retransmits, timeouts), never a
  local error. The rules are drawn from the active faults by the pure `render()` and loaded
  as one nft transaction, so healing one fault leaves the others exactly as they were. Loss
  uses `numgen random mod 100 < P`: each packet independently.
- bandwidth is a tbf qdisc on both ends of the node's veth pair (the bridge's end shapes what
  the node receives, the node's `eth0` what it sends).
- delay with jitter would be netem, but this machine's kernel is built without it
  (CONFIG_NET_SCH_NETEM). It has NFQUEUE: an iptables rule in the node's namespace queues
  every packet it sends to the other nodes (loopback stays fast), and a delayer process there
  (tests/chaos/delayer.py) accepts each one `delay` +- `jitter` later (uniform, seeded;
  reordering included, as netem does). `--queue-bypass`: a queue nobody serves passes packets.
- a skewed clock is libfaketime (Debian's `faketime`) preloaded into a process through its
  environment: every time it reads (time(), clock_gettime(CLOCK_REALTIME)) is shifted, the
  monotonic clock is not (FAKETIME_DONT_FAKE_MONOTONIC), and its children inherit it. The
  environment, not the `faketime` wrapper command, because that one forks and the PID we hold
  must be the process itself.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from controller.launch import read_json_line
from tests.chaos.network import SUBNET, NetworkError, run

if TYPE_CHECKING:
    from tests.chaos.network import Network

TABLE = "chaos"
FAKETIME_LIBRARY = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
KINDS = ("partition", "cut", "loss", "bandwidth", "delay")


@dataclass(frozen=True)
class Rule:
    """Drop packets from `src` to `dst` (addresses; "" is any node), all of them or `percent`."""
    src: str
    dst: str
    percent: int = 100

    def nft(self) -> str:
        match = " ".join(part for part in (f"ip saddr {self.src}" if self.src else "",
                                           f"ip daddr {self.dst}" if self.dst else "") if part)
        odds = f" numgen random mod 100 < {self.percent}" if self.percent < 100 else ""
        return f"{match}{odds} drop"


@dataclass
class FaultRecord:
    """One fault as it was carried out: what, on whom, when it began and ended (None: active)."""
    id: int
    kind: str
    target: str
    detail: str
    began_at: float
    ended_at: float | None = None
    rules: tuple[Rule, ...] = field(default=(), repr=False)
    shaped: tuple[str, ...] = field(default=(), repr=False)  # "namespace dev" pairs with a tbf
    delayer: subprocess.Popen | None = field(default=None, repr=False)  # the NFQUEUE delayer (delay)
    queued: tuple[str, ...] = field(default=(), repr=False)  # (namespace, *iptables rule) of the delay

    def to_json(self) -> dict:
        return {"kind": self.kind, "target": self.target, "detail": self.detail, "began_at": self.began_at,
                "ended_at": self.ended_at}


def render(rules: list[Rule]) -> str:
    """The nft script that makes the bridge drop exactly `rules` (replacing whatever it dropped)."""
    body = "".join(f"\n    {r.nft()}" for r in rules)
    return (f"table bridge {TABLE}\ndelete table bridge {TABLE}\n"
            f"table bridge {TABLE} {{\n  chain forward {{\n    type filter hook forward priority 0; policy accept;"
            f"{body}\n  }}\n}}\n")


def skewed_clock(skew_s: float) -> dict[str, str]:
    """Environment variables under which a process sees its wall clock `skew_s` seconds off
    (positive: ahead). ValueError names a skew that is not a finite number."""
    if not isinstance(skew_s, (int, float)) or skew_s != skew_s or abs(skew_s) == float("inf"):
        raise ValueError(f"clock skew must be a finite number of seconds, got {skew_s!r}")
    if not os.path.exists(FAKETIME_LIBRARY):
        raise NetworkError(f"a skewed clock needs libfaketime ({FAKETIME_LIBRARY}): run 'apt-get install faketime' "
                           f"as root (make test does)")
    return {"LD_PRELOAD": FAKETIME_LIBRARY, "FAKETIME": f"{skew_s:+g}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_DONT_RESET": "1"}


class Faults:
    """The faults of one Network; every change is recorded with `clock()`'s time."""

    def __init__(self, net: "Network", clock: Callable[[], float] = time.time) -> None:
        self.net = net
        self.clock = clock
        self.records: list[FaultRecord] = []
        self._ids = itertools.count(1)

    def install(self) -> None:
        """An empty rule table on the bridge (Network.start calls it)."""
        run("nft", "-f", "-", namespace=self.net.bridge_ns, stdin=f"table bridge {TABLE}\n")
        self._apply()

    def active(self) -> list[FaultRecord]:
        return [r for r in self.records if r.ended_at is None]

    # ------------------------------------------------------------------ faults

    def partition(self, name: str) -> int:
        """`name` and every other node (now and added later) exchange nothing."""
        address = self.net.node(name).address
        return self._add("partition", name, f"{name} cut from every node",
                         rules=(Rule(address, ""), Rule("", address)))

    def cut(self, name: str, others: list[str]) -> int:
        """`name` and each of `others` exchange nothing; the rest of the network is untouched."""
        if not others:
            raise ValueError(f"cut {name!r} from whom? others is empty")
        address = self.net.node(name).address
        peers = [self.net.node(o).address for o in others]
        if address in peers:
            raise ValueError(f"cannot cut {name!r} from itself")
        rules = tuple(r for p in peers for r in (Rule(address, p), Rule(p, address)))
        return self._add("cut", name, f"{name} cut from {', '.join(others)}", rules=rules)

    def loss(self, name: str, percent: int) -> int:
        """`percent` % of the packets `name` sends and receives are dropped, each on its own."""
        if not isinstance(percent, int) or not 0 < percent < 100:
            raise ValueError(f"loss percent must be a whole number from 1 to 99, got {percent!r}")
        address = self.net.node(name).address
        return self._add("loss", name, f"{percent}% of {name}'s packets lost",
                         rules=(Rule(address, "", percent), Rule("", address, percent)))

    def bandwidth(self, name: str, rate_kbit: int) -> int:
        """`name`'s link carries at most `rate_kbit` kbit/s each way (a token bucket)."""
        if not isinstance(rate_kbit, int) or rate_kbit < 8:
            raise ValueError(f"bandwidth must be a whole number of kbit/s, at least 8, got {rate_kbit!r}")
        node = self.net.node(name)
        ends = (f"{self.net.bridge_ns} {node.port}", f"{node.namespace} eth0")
        burst = max(rate_kbit * 1000 // 8 // 100, 4096)  # 10 ms of traffic, at least a few packets
        for end in ends:
            ns, dev = end.split()
            run("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_kbit}kbit",
                "burst", str(burst), "latency", "200ms", namespace=ns)
        return self._add("bandwidth", name, f"{name}'s link capped at {rate_kbit} kbit/s", shaped=ends)

    def delay(self, name: str, delay_ms: float, jitter_ms: float, seed: int = 0) -> int:
        """What `name` sends to the other nodes waits `delay_ms` +- `jitter_ms` (an NFQUEUE
        delayer, see the module docstring)."""
        if not 0 < delay_ms <= 10_000 or not 0 <= jitter_ms <= delay_ms:
            raise ValueError(f"delay must be 0 < delay_ms <= 10000 and 0 <= jitter_ms <= delay_ms, got "
                             f"{delay_ms!r} +- {jitter_ms!r}")
        node = self.net.node(name)
        if any(r.delayer is not None and r.target == name for r in self.active()):
            raise ValueError(f"{name!r} is delayed already (heal that first)")
        with self.net.entered(name):
            delayer = subprocess.Popen([sys.executable, "-m", "tests.chaos.delayer", "--queue", "0", "--delay-ms",
                                        f"{delay_ms:g}", "--jitter-ms", f"{jitter_ms:g}", "--seed", str(seed)],
                                       stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        rule = ("OUTPUT", "-d", f"{SUBNET}.0/24", "-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass")
        try:
            read_json_line(delayer, 30.0, f"the delayer of {name}")
            run("iptables", "-A", *rule, namespace=node.namespace)
        except BaseException:
            _stop(delayer)
            raise
        return self._add("delay", name, f"{name} delayed {delay_ms:g} ms +- {jitter_ms:g} ms",
                         delayer=delayer, queued=(node.namespace, *rule))

    def heal(self, fault_id: int) -> FaultRecord:
        """Undo fault `fault_id` (the others stay); ValueError names one not active."""
        record = next((r for r in self.records if r.id == fault_id), None)
        if record is None or record.ended_at is not None:
            raise ValueError(f"fault {fault_id} is not active (active: {[r.id for r in self.active()]})")
        record.ended_at = self.clock()
        if record.rules:
            self._apply()
        for end in record.shaped:
            ns, dev = end.split()
            run("tc", "qdisc", "del", "dev", dev, "root", namespace=ns)
        if record.queued:  # no new packet for the delayer, then it lets the held ones go and ends
            run("iptables", "-D", *record.queued[1:], namespace=record.queued[0])
        if record.delayer is not None:
            _stop(record.delayer)
        return record

    def heal_all(self) -> None:
        for record in self.active():
            self.heal(record.id)

    # ------------------------------------------------------------------ the rules

    def _add(self, kind: str, target: str, detail: str, rules: tuple[Rule, ...] = (),
             shaped: tuple[str, ...] = (), **undo) -> int:
        record = FaultRecord(next(self._ids), kind, target, detail, self.clock(), rules=rules, shaped=shaped, **undo)
        self.records.append(record)
        if rules:
            try:
                self._apply()
            except BaseException:
                self.records.remove(record)
                raise
        return record.id

    def _apply(self) -> None:
        rules = [rule for r in self.active() for rule in r.rules]
        run("nft", "-f", "-", namespace=self.net.bridge_ns, stdin=render(rules))


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM (the delayer lets its held packets go), SIGKILL after `grace_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace_s)
    if proc.stdout is not None:
        proc.stdout.close()
