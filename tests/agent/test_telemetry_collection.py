"""Collection end to end with real processes: trainers write telemetry rings (fthsdp.telemetry),
real agents read and summarize them every half second, a real controller finds the trainer that
never joined its collective and evicts its host onto the spare.

Every wait is a condition with a generous bound; nothing asserts on wall-clock time."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.agent.cluster import Cluster
from tests.agent.helpers import trainer_command, wait_for, wait_for_async

pytestmark = pytest.mark.slow
BOUND_S = 45


async def start(tmp_path, dry_run: bool) -> Cluster:
    c = Cluster(tmp_path, heartbeat_timeout_s=10.0)
    settings = tmp_path / "controller.json"
    settings.write_text(json.dumps({"diagnosis": {"hang_after_s": 2.0, "analysis_interval_s": 0.5}}))
    await c.start_controller(2, 0, "--settings", str(settings), *(("--diagnosis-dry-run",) if dry_run else ()))
    command = trainer_command(c.ready_dir, "--join", "--telemetry", "h11:r1")
    extra = ("--telemetry-interval-s", "0.5", "--telemetry-window-collectives", "4")
    for r in range(2):
        for k in range(2):
            await c.start_agent(f"h{r}{k}", replica=f"r{r}", rank=k, world_size=2, command=command, extra=extra)
    await c.start_agent("s0", spare=True, command=command, extra=extra)
    return c


@pytest.fixture
async def cluster(tmp_path, request):
    c = await start(tmp_path, getattr(request, "param", False))
    yield c
    await c.close()


async def found(c: Cluster) -> list[dict]:
    page = await c.get("/api/v1/diagnoses")
    return [f for f in page["findings"] if f["kind"] == "hang"]


async def decided(c: Cluster, action: str) -> list[dict]:
    """The hang findings, once one is decided `action`. The first decision may be a report:
    only h10 witnesses the hang until h11's own idle telemetry is read (issue 23's evidence
    rule); the finding is then decided again in its entry."""
    hangs = await found(c)
    return hangs if any(f["action"] == action for f in hangs) else []


async def test_agents_collect_rings_and_the_controller_evicts_the_hung_host(cluster):
    c = cluster

    [f] = await wait_for_async(lambda: decided(c, "evict"), BOUND_S, "the hang found and decided")
    assert f["hosts"][0] == "h11" and f["ranks"][0] == "r1/1" and f["action"] == "evict"
    assert any("never joined: its last collective there is #4" in e for e in f["evidence"])
    assert "collective #5 of group replica of replica r1" in f["summary"]

    h11 = await c.host("h11")
    assert h11["cordoned"] and h11["cordon_reason"].startswith("diagnosis finding")
    rebuilt = await wait_for(lambda: [t for t in c.trainers("r1", "1") if t["env"]["FTHSDP_HOST_ID"] == "s0"],
                             BOUND_S, "r1/1 restarted on the spare")
    # each trainer's ring lies in a directory only the agent's user can open
    ring = rebuilt[0]["env"]["FTHSDP_TELEMETRY_FILE"]
    await wait_for(lambda: os.path.exists(ring), BOUND_S, "the new trainer's ring")
    assert ring.endswith("slot-0.ring") and stat.S_IMODE(os.stat(os.path.dirname(ring)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(ring).st_mode) == 0o600
    page = await c.get("/api/v1/diagnoses")
    assert page["actions_by_kind"]["evict"] == 1 and page["findings_by_kind"]["hang"] == 1


@pytest.mark.parametrize("cluster", [True], indirect=True)
async def test_dry_run_reports_the_eviction_it_would_make_and_makes_none(cluster):
    c = cluster
    [f] = await wait_for_async(lambda: decided(c, "dry_run"), BOUND_S, "the hang found and decided")
    assert f["hosts"][0] == "h11" and f["action"] == "dry_run"
    assert f["action_reason"].startswith("dry-run: would evict host h11")
    h11, spare = await c.host("h11"), await c.host("s0")
    assert not h11["cordoned"] and h11["assignment"]["replica_id"] == "r1" and spare["assignment"] is None
    job = await c.get("/api/v1/job")
    assert job["swaps"] == 0
    page = await c.get("/api/v1/diagnoses")
    assert page["dry_run"] is True and page["actions_by_kind"]["evict"] == 0
    assert page["actions_by_kind"]["dry_run"] == 1
    events = [e for e in await c.events("diagnosis")]  # oldest first: the last says what was decided
    assert "dry_run: dry-run: would evict host h11" in events[-1]["message"]
