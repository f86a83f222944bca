"""protos/local_ports.py: the ports the demo's trainers and the benchmarks' services listen on
later come from where no port-0 bind lands, and a port in use is never handed out."""

from __future__ import annotations

import socket

import pytest

from protos.local_ports import WINDOW, listen_port, window


def test_the_window_lies_just_below_the_ephemeral_range(tmp_path):
    f = tmp_path / "range"
    f.write_text("32768\t60999\n")
    assert window(str(f)) == range(32768 - WINDOW, 32768)
    f.write_text("1024 65535\n")  # no room below: port-0 picks instead
    assert window(str(f)) == range(0)
    assert window(str(tmp_path / "missing")) == range(32768 - WINDOW, 32768)


def test_port_zero_binds_never_land_on_the_ports_handed_out():
    """The demo's race: its controller bound port 0 and got a port picked for a replica's gloo store."""
    handed = {listen_port() for _ in range(20)}
    assert handed <= set(window()), handed
    held = []
    try:
        for _ in range(300):  # what a busy machine's controllers, agents and connections take meanwhile
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
    finally:
        for s in held:
            s.close()
    assert not taken & handed and not taken & set(window())


def test_a_port_someone_listens_on_is_skipped():
    port = listen_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        for _ in range(4):  # wherever the turn starts in the two ports, the busy one is passed over
            assert listen_port(range(port, port + 2)) == port + 1


def test_a_full_window_is_an_error_naming_it():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"no free loopback port in {port}..{port}"):
            listen_port(range(port, port + 1))


def test_the_tests_blocks_the_agents_picks_and_the_window_never_meet():
    """Three owners pick ports for later listeners on one machine: the tests (a block per xdist
    worker), the agents and the demo/benchmarks (the window). Their ranges must be disjoint."""
    from agent.ports import LOWEST_PORT, highest_port
    from tests import ports

    tests_top = ports.BASE + 4 * ports.BLOCK - 1
    assert tests_top < LOWEST_PORT <= highest_port() < window().start
