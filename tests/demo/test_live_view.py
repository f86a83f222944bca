"""The demo's live view on a terminal: redrawn in place (never a cleared screen), from a
live controller's REST API."""

from __future__ import annotations

import io
import re

import grpc
import httpx
from rich.console import Console

from fthsdp.demo.run import Progress
from protos import controller_pb2 as pb
from protos import controller_pb2_grpc as pbg


def test_the_live_view_updates_in_place(controller_process):
    ctl = controller_process("--job-id", "live", "--replicas", "1", "--event-log", "off")
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, height=40, color_system=None)
    with httpx.Client(base_url=ctl.http, timeout=5) as http:
        progress = Progress(http, 10, tty=True, console=console)
        try:
            frames = []
            with grpc.insecure_channel(ctl.grpc) as channel:
                stub = pbg.ControllerStub(channel)
                for step in range(3):
                    q = stub.Quorum(pb.QuorumRequest(job_id="live", replica_id="r0", step=step, world_size=1), timeout=10)
                    stub.ReportStep(pb.ReportStepRequest(job_id="live", replica_id="r0", step=step,
                                                         quorum_id=q.quorum_id), timeout=10)
                    progress.show(http.get("/api/v1/job").json(), http.get("/api/v1/replicas").json(), float(step))
                    frames.append(screen.getvalue())
            progress.note("step 2: kill-trainer r0: SIGKILL trainer pid 1")
        finally:
            progress.close()
    out = screen.getvalue()
    assert "\x1b[2J" not in out and "\x1b[H" not in out  # the screen is never cleared
    assert re.search(r"\x1b\[\d*A", out), "each frame moves the cursor back over the last one"
    assert "r0" in frames[0] and "HEALTHY" in frames[-1] and "demo: step 2 of 10" in frames[-1]
    assert "kill-trainer r0" in out
