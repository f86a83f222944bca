"""Issue 26's texts, with a real controller and a real agent: every clipped text is cut at a
character boundary (scenario 5's last part: a trainer dies with a long last stderr line of
multi-byte characters; the host's cordon reason (REST) and the cordon event keep whole
characters, end with the cut marker, and stay within the controller's max_reason_chars), and a
SIGKILLed trainer's death reason quotes no unrelated last log line."""

from __future__ import annotations

import sys

import pytest

from controller.core.checks import CUT_MARKER
from controller.settings import ControllerSettings
from tests.agent.cluster import Cluster
from tests.agent.helpers import wait_for_async

pytestmark = pytest.mark.slow
BOUND_S = 60
#: A trainer whose last words are 3,000 euro signs (3 bytes each in UTF-8), then exit 1.
DIES_LOUDLY = (sys.executable, "-c", "import sys; sys.stderr.write('\\u20ac' * 3000 + '\\n'); sys.exit(1)")
#: A trainer that logs a line of its training, then is SIGKILLed (by itself, as by the OOM killer).
KILLED = (sys.executable, "-c", "import os, signal, sys; sys.stderr.write('step 40 loss 2.1\\n'); sys.stderr.flush(); "
                                "os.kill(os.getpid(), signal.SIGKILL)")


async def cordoned(c: Cluster, host_id: str) -> dict:
    async def check():
        host = await c.host(host_id)
        return host["cordoned"] and host["cordon_reason"] and host
    return await wait_for_async(check, BOUND_S, f"{host_id} cordoned after its trainer's death")


async def test_a_long_multibyte_last_line_is_clipped_at_a_character_boundary(tmp_path):
    c = Cluster(tmp_path)
    try:
        await c.start_controller(1, 0)
        await c.start_agent("h0", replica="r0", command=DIES_LOUDLY)
        host = await cordoned(c, "h0")
        [event] = await c.events("cordon")
        limit = ControllerSettings().max_reason_chars
        marker = CUT_MARKER.split("{")[0]
        for text in (host["cordon_reason"], event["message"]):
            assert "died (exit code 1): €€€" in text, text
            assert "\ufffd" not in text and marker in text and len(text) <= limit, text
            assert set(text.split("died (exit code 1): ")[1].split(marker)[0]) == {"€"}  # whole ones up to the cut
    finally:
        await c.close()


async def test_a_sigkilled_trainers_death_reason_quotes_no_unrelated_last_line(tmp_path):
    c = Cluster(tmp_path)
    try:
        await c.start_controller(1, 0)
        await c.start_agent("h0", replica="r0", command=KILLED)
        host = await cordoned(c, "h0")
        [event] = await c.events("cordon")
        for text in (host["cordon_reason"], event["message"]):
            assert text.endswith("trainer rank 0 on host h0 died (signal 9)"), text
            assert "step 40" not in text
    finally:
        await c.close()
