"""The test network (tests/chaos/network.py) and its faults (tests/chaos/net_faults.py), on
real namespaces, real sockets and real processes: nothing here is simulated."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time

import pytest

from tests.chaos import network
from tests.chaos.net_faults import Rule, render, skewed_clock
from tests.chaos.network import Network, NetworkError

PORT = 7000
CONNECT_S = 0.5   # a cut link answers nothing: this long proves it silent
REACH_S = 10.0    # a link that works answers at once; this bounds the wait on a loaded machine


def _root_links() -> set[str]:
    return {line.split(":")[1].strip().split("@")[0] for line in network.run("ip", "-o", "link").splitlines()}


@contextlib.contextmanager
def _listener(net: Network, name: str, kind: int = socket.SOCK_STREAM):
    with net.entered(name):
        s = socket.socket(socket.AF_INET, kind)
    s.bind((net.node(name).address, PORT))
    if kind == socket.SOCK_STREAM:
        s.listen(16)
    try:
        yield s
    finally:
        s.close()


def _connects(net: Network, src: str, dst_address: str, port: int = PORT,
              timeout_s: float = CONNECT_S) -> bool | str:
    """True if a TCP connection from node `src` to `dst_address` is accepted within `timeout_s`;
    else the error's kind ("silence": no answer)."""
    with net.entered(src):
        s = socket.socket()
    s.settimeout(timeout_s)
    try:
        s.connect((dst_address, port))
        return True
    except socket.timeout:
        return "silence"
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()


def test_two_namespaces_reach_each_other_and_nothing_else():
    root = socket.socket()  # a listener in the host's own namespace, on every address it has
    root.bind(("0.0.0.0", 0))
    root.listen(1)
    host_ip = socket.gethostbyname(socket.gethostname())
    try:
        with Network() as net:
            a, b = net.add("a"), net.add("b")
            assert a.address != b.address and a.address.startswith(network.SUBNET)
            with _listener(net, "b"):
                assert _connects(net, "a", b.address, timeout_s=REACH_S) is True
            with net.observer():
                probe = socket.socket()
            probe.settimeout(CONNECT_S)
            with _listener(net, "a"), probe:
                probe.connect((a.address, PORT))  # the observer (the bridge) reaches every node
            # the host's listener is out of reach: a node's loopback is its own, the host's
            # addresses have no route
            assert _connects(net, "a", "127.0.0.1", root.getsockname()[1]) == "ConnectionRefusedError"
            if not host_ip.startswith("127."):
                assert _connects(net, "a", host_ip, root.getsockname()[1]) is not True
    finally:
        root.close()


def test_teardown_leaves_no_namespace_link_or_rule_behind():
    links_before = _root_links()
    net = Network().start()
    names = [net.add(n).namespace for n in ("h0", "h1", "etcd")] + [net.bridge_ns]
    assert set(names) <= set(network.list_namespaces())
    net.faults.partition("h0")
    net.faults.bandwidth("h1", 1000)
    net.close()
    assert not set(names) & set(network.list_namespaces())
    assert _root_links() == links_before  # nothing was ever made in the host's namespace
    net.close()  # twice is fine


def test_a_block_that_raises_still_tears_the_network_down():
    with pytest.raises(RuntimeError, match="boom"), Network() as net:
        made = [net.add("x").namespace, net.bridge_ns]
        raise RuntimeError("boom")
    assert not set(made) & set(network.list_namespaces())


def test_leftovers_of_a_run_whose_process_died_are_removed_and_a_live_runs_are_not():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"{network.PREFIX}{dead.pid}-h0"
    with Network() as live:
        live.add("h0")
        network.run("ip", "netns", "add", stale)
        removed = network.remove_leftovers()
        assert stale in removed
        assert stale not in network.list_namespaces()
        assert live.node("h0").namespace in network.list_namespaces()


def test_bad_node_names_are_refused_and_change_nothing():
    with Network() as net:
        net.add("h0")
        for bad in ("H0", "0h", "h-0", "averyveryverylongname", "h0"):
            with pytest.raises(ValueError, match=repr(bad)):
                net.add(bad)
        assert list(net.nodes) == ["h0"]
        with pytest.raises(ValueError, match="'nope'"):
            net.faults.partition("nope")
        for bad in (0, 100, 2.5):
            with pytest.raises(ValueError, match=repr(bad)):
                net.faults.loss("h0", bad)
        with pytest.raises(ValueError, match="4"):
            net.faults.bandwidth("h0", 4)
        assert net.faults.records == []


def test_a_partition_is_silent_until_healed_and_recorded_with_its_times():
    clock = iter(float(t) for t in range(100, 200))
    with Network() as net:
        net.faults.clock = lambda: next(clock)
        for n in ("h0", "h1", "c"):
            net.add(n)
        with _listener(net, "h1"):
            fid = net.faults.partition("h1")
            assert _connects(net, "h0", net.node("h1").address) == "silence"
            assert _connects(net, "c", net.node("h1").address) == "silence"
            record = net.faults.heal(fid)
            assert _connects(net, "h0", net.node("h1").address, timeout_s=REACH_S) is True
        assert record.to_json() == {"kind": "partition", "target": "h1", "detail": "h1 cut from every node",
                                    "began_at": 100.0, "ended_at": 101.0}
        with pytest.raises(ValueError, match=f"fault {fid} is not active"):
            net.faults.heal(fid)


def test_asymmetric_cuts_leave_the_other_paths_alone():
    with Network() as net:
        for n in ("h0", "h1", "c", "etcd"):
            net.add(n)
        with _listener(net, "h1"), _listener(net, "etcd"):
            peers = net.faults.cut("h1", ["h0"])          # reaches the controller, not its peer
            assert _connects(net, "h0", net.node("h1").address) == "silence"
            assert _connects(net, "c", net.node("h1").address, timeout_s=REACH_S) is True
            controller = net.faults.cut("h1", ["c"])      # both at once; healing one keeps the other
            net.faults.heal(peers)
            assert _connects(net, "h0", net.node("h1").address, timeout_s=REACH_S) is True
            assert _connects(net, "c", net.node("h1").address) == "silence"
            net.faults.heal(controller)
            from_etcd = net.faults.cut("c", ["etcd"])     # a controller cut from etcd, agents still reach it
            assert _connects(net, "c", net.node("etcd").address) == "silence"
            assert _connects(net, "h1", net.node("etcd").address, timeout_s=REACH_S) is True
            net.faults.heal(from_etcd)
            assert _connects(net, "c", net.node("etcd").address, timeout_s=REACH_S) is True


def test_loss_drops_a_share_of_packets_each_on_its_own():
    sent = 400
    with Network() as net:
        net.add("h0"), net.add("h1")
        fid = net.faults.loss("h1", 50)
        with _listener(net, "h1", socket.SOCK_DGRAM) as rx:
            rx.setsockopt(socket.SOL_SOCKET, 33, 4 << 20)  # SO_RCVBUFFORCE (root): none dropped for a full buffer
            rx.settimeout(CONNECT_S)
            with net.entered("h0"):
                tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            with tx:
                for i in range(sent):
                    tx.sendto(b"%d" % i, (net.node("h1").address, PORT))
            got = 0
            with contextlib.suppress(socket.timeout):
                while True:
                    rx.recv(64)
                    got += 1
        net.faults.heal(fid)
        # each packet lost with odds 1/2: 400 sent, so well inside (100, 300) unless the rule is not there
        assert 100 < got < 300, got


def test_a_bandwidth_cap_is_a_token_bucket_on_both_ends_until_healed():
    with Network() as net:
        h0 = net.add("h0")
        fid = net.faults.bandwidth("h0", 2000)
        bridge_end = network.run("tc", "qdisc", "show", "dev", h0.port, namespace=net.bridge_ns)
        node_end = network.run("tc", "qdisc", "show", "dev", "eth0", namespace=h0.namespace)
        assert "tbf" in bridge_end and "2Mbit" in bridge_end, bridge_end
        assert "tbf" in node_end and "2Mbit" in node_end, node_end
        net.faults.heal(fid)
        assert "tbf" not in network.run("tc", "qdisc", "show", "dev", "eth0", namespace=h0.namespace)


def test_a_delay_holds_what_the_node_sends_until_healed():
    with Network() as net:
        net.add("h0"), net.add("h1")
        with _listener(net, "h1"):
            fid = net.faults.delay("h0", 300, 50)
            record = net.faults.records[-1]
            with net.entered("h0"):
                s = socket.socket()
            with s:
                s.settimeout(10.0)
                began = time.monotonic()
                s.connect((net.node("h1").address, PORT))  # its SYN waited 250-350 ms in the queue
                # a lower bound only: a loaded machine makes it later, never earlier
                assert time.monotonic() - began >= 0.25
            assert "NFQUEUE" in network.run("iptables", "-S", "OUTPUT", namespace=net.node("h0").namespace)
            net.faults.heal(fid)
            assert record.delayer.returncode == 0  # it let its held packets go and ended
            assert "NFQUEUE" not in network.run("iptables", "-S", "OUTPUT", namespace=net.node("h0").namespace)
            assert _connects(net, "h0", net.node("h1").address, timeout_s=REACH_S) is True
            for bad in ((0, 0), (100, 200), (20_000, 0)):
                with pytest.raises(ValueError, match="delay must be"):
                    net.faults.delay("h0", *bad)


def test_the_rules_are_drawn_from_the_active_faults():
    script = render([Rule("10.77.0.1", ""), Rule("", "10.77.0.1"), Rule("10.77.0.2", "10.77.0.3", 3)])
    assert "ip saddr 10.77.0.1 drop" in script
    assert "ip daddr 10.77.0.1 drop" in script
    assert "ip saddr 10.77.0.2 ip daddr 10.77.0.3 numgen random mod 100 < 3 drop" in script
    assert script.count("drop") == 3
    assert "drop" not in render([])


def test_a_skewed_clock_shifts_wall_time_of_the_process_and_its_children_not_monotonic():
    code = ("import json, subprocess, sys, time; child = subprocess.run([sys.executable, '-c', "
            "'import time; print(time.time())'], capture_output=True, text=True).stdout; "
            "print(json.dumps([time.time(), float(child), time.monotonic()]))")
    import os
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **skewed_clock(400)})
    wall, child, mono = json.loads(out.stdout)
    after = time.time()
    assert before + 400 <= wall <= after + 400
    assert before + 400 <= child <= after + 400
    assert mono < time.monotonic() + 1  # not shifted
    with pytest.raises(ValueError, match="nan"):
        skewed_clock(float("nan"))


def test_a_process_started_from_an_entered_thread_runs_in_that_namespace_with_its_own_pid():
    with Network() as net:
        net.add("a"), net.add("b")
        with net.entered("a"):
            proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        try:
            assert net.pids() == {"a": [proc.pid]}
        finally:
            proc.kill()
            proc.wait(10)
        assert net.pids() == {}
