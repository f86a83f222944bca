"""Connection errors that surface (issue 39, finding 5), with a real controller and real agents
(subprocesses on loopback): a wrong address ends within the short first-connection timeout
after a few log lines (one per doubling of the attempts, each naming the address and the
reason); a second agent with a live agent's host id is refused, naming the other incarnation;
a job secret that differs from the controller's is said in those words. The log-and-give-up
rule on a fake clock is tests/test_dial_outage.py.

Every wait is a condition with a bound; nothing asserts on wall-clock time."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from agent.main import EXIT_CONNECT_TIMEOUT, parse
from protos import job_secret
from tests.agent.cluster import CLI, Cluster
from tests.agent.helpers import trainer_command
from tests.sockets import refused_address

pytestmark = pytest.mark.slow
BOUND_S = 60
EXIT_REFUSED = 3


def test_a_wrong_address_gives_up_after_the_short_timeout_with_a_line_per_doubling(tmp_path):
    address = refused_address()
    run = subprocess.run([*CLI, "agent", "--controller", address, "--host-id", "h1", "--spare",
                          "--connect-timeout-s", "4", "--insecure", "--", *trainer_command(tmp_path)],
                         capture_output=True, text=True, timeout=BOUND_S)
    assert run.returncode == EXIT_CONNECT_TIMEOUT, run.stderr
    lines = [line for line in run.stderr.splitlines() if f"controller {address} failed" in line]
    assert all("UNAVAILABLE" in line and "--connect-timeout-s" in line for line in lines), lines
    made = int(run.stderr.split("no controller answered for ")[1].split("(")[1].split(" attempt")[0])
    assert made > len(lines) >= 2 and len(lines) <= made.bit_length(), (made, lines)  # 1st, 2nd, 4th, ...
    assert "giving up (--connect-timeout-s 4)" in run.stderr


def test_the_connect_timeouts_are_short_for_a_first_connection_and_come_from_flags_or_the_environment():
    base = ["--controller", "127.0.0.1:1", "--host-id", "h1", "--spare", "--insecure"]
    s = parse([*base, "--", "t"], environ={})
    assert (s.connect_timeout_s, s.reconnect_timeout_s) == (60.0, 300.0)
    env = {"FTHSDP_CONNECT_TIMEOUT_S": "7", "FTHSDP_RECONNECT_TIMEOUT_S": "900"}
    s = parse([*base, "--", "t"], environ=env)
    assert (s.connect_timeout_s, s.reconnect_timeout_s) == (7.0, 900.0)
    s = parse([*base, "--connect-timeout-s", "5", "--reconnect-timeout-s", "50", "--", "t"], environ=env)  # flags win
    assert (s.connect_timeout_s, s.reconnect_timeout_s) == (5.0, 50.0)
    with pytest.raises(ValueError, match="FTHSDP_RECONNECT_TIMEOUT_S='soon' is not a number of seconds"):
        parse([*base, "--", "t"], environ={"FTHSDP_RECONNECT_TIMEOUT_S": "soon"})


async def test_a_second_agent_with_a_live_agents_host_id_is_refused_naming_the_other(tmp_path):
    c = Cluster(tmp_path, heartbeat_timeout_s=2.0)
    try:
        await c.start_controller(replicas=1)
        await c.start_agent("h0", spare=True)
        first = (await c.host("h0"))["incarnation"]
        second = await c.start_agent("h0", spare=True, wait=False, name="h0-again",
                                     extra=("--connect-timeout-s", "4"))
        assert await asyncio.wait_for(second.proc.wait(), BOUND_S) == EXIT_REFUSED, second.log()
        assert "another agent with the same host id is alive and registered" in second.log()
        assert f"incarnation {first}" in second.log()
        assert (await c.host("h0"))["incarnation"] == first  # the first one keeps its host
    finally:
        await c.close()


async def test_a_job_secret_that_differs_from_the_controllers_is_said_plainly(tmp_path):
    c = Cluster(tmp_path)
    try:
        await c.start_controller(replicas=1)  # it holds the cluster's secret
        other = _secret_file(tmp_path, "other")
        agent = await c.start_agent("h0", spare=True, wait=False, extra=("--job-secret-file", str(other)))
        assert await asyncio.wait_for(agent.proc.wait(), BOUND_S) == EXIT_REFUSED, agent.log()
        assert "the job secret differs from the controller's" in agent.log()
        assert "HMAC" not in agent.log()
    finally:
        await c.close()


def _secret_file(tmp_path, name: str):
    path = tmp_path / f"{name}.secret"
    path.write_text(job_secret.generate())
    return path
