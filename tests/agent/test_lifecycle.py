"""The agent's life against an in-process fake controller, with real trainer processes: it
registers as available or spare with its address and ports, deregisters on a clean stop,
waits while another live agent holds its host, and keeps its secret for its next process."""

from __future__ import annotations

import socket

from agent import state_file
from agent.ports import LOWEST_PORT, highest_port, is_free, pick_ports
from protos.local_ports import window
from tests.agent.helpers import alive, ready_files, wait_for


async def test_an_agent_without_assignment_registers_available_with_where_it_is_reached(controller, start_agent):
    run = start_agent([controller.address], replica_id="", ranks=(), world_size=0, slots=2,
                      advertise_address="10.3.0.7", rendezvous_port=29500)
    await wait_for(lambda: controller.registrations, 10, "registration")
    [reg] = controller.registrations
    assert not reg.spare and not reg.HasField("assignment")  # available: the controller picks its work
    assert (reg.address, reg.rendezvous_port) == ("10.3.0.7", 29500)
    assert reg.coordinator_port == run.agent.ports[1] and reg.coordinator_port not in (0, 29500)


async def test_a_spare_registers_as_a_spare(controller, start_agent):
    start_agent([controller.address], replica_id="", ranks=(), world_size=0, spare=True)
    await wait_for(lambda: controller.registrations, 10, "registration")
    [reg] = controller.registrations
    assert reg.spare and reg.address == "" and reg.rendezvous_port == reg.coordinator_port == 0


async def test_a_clean_stop_deregisters_and_forgets_the_kept_secret(controller, start_agent, tmp_path):
    state = tmp_path / "state"
    run = start_agent([controller.address], state_dir=str(state))
    [info] = await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    kept = state_file.path_for(str(state), "h1")
    assert kept.read_text() == controller.secrets[run.agent.incarnation]
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    run.agent.stop_reason = "the agent got SIGTERM"
    await run.close()
    [d] = controller.deregistrations
    assert (d.host_id, d.incarnation, d.reason) == ("h1", run.agent.incarnation, "the agent got SIGTERM")
    assert d.agent_secret == controller.secrets[run.agent.incarnation]
    assert not kept.exists() and not alive(info["pid"])


async def test_a_restarted_agent_presents_its_predecessors_secret_once(controller, start_agent, tmp_path):
    state = str(tmp_path / "state")
    first = start_agent([controller.address], state_dir=state)
    await wait_for(lambda: ready_files(tmp_path), 10, "trainer ready")
    secret = controller.secrets[first.agent.incarnation]
    first.task.cancel()  # a crash: no deregistration, the kept secret stays
    await wait_for(lambda: first.task.done(), 10, "the first agent gone")
    assert not controller.deregistrations
    second = start_agent([controller.address], state_dir=state)
    await wait_for(lambda: len(controller.registrations) == 2, 10, "the second agent's registration")
    assert controller.registrations[1].previous_secret == secret
    assert controller.registrations[1].incarnation == second.agent.incarnation != first.agent.incarnation
    kept = state_file.path_for(state, "h1")
    await wait_for(lambda: kept.read_text() == controller.secrets[second.agent.incarnation], 10, "the new secret kept")


async def test_while_another_live_agent_holds_the_host_the_agent_waits_and_retries(controller, start_agent,
                                                                                 tmp_path):
    controller.busy = 2
    run = start_agent([controller.address], reconnect_cap_s=0.2)
    [info] = await wait_for(lambda: ready_files(tmp_path), 15, "trainer ready after the retries")
    assert len(controller.registrations) == 3 and not run.task.done() and alive(info["pid"])
    assert len({r.incarnation for r in controller.registrations}) == 1  # the same identity, asked again


def test_picked_ports_are_free_distinct_and_below_the_ephemeral_range():
    taken = socket.create_server(("", 0))  # a port that is not free
    try:
        ports = pick_ports(3, avoid=frozenset({20001}))
        assert len(set(ports)) == 3 and 20001 not in ports and taken.getsockname()[1] not in ports
        assert all(LOWEST_PORT <= p <= highest_port() and is_free(p) for p in ports)
        assert highest_port() < window().start  # never a port the demo or a benchmark handed out
        assert not is_free(taken.getsockname()[1])
    finally:
        taken.close()
