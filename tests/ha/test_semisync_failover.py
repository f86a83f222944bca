"""Real processes: a DiLoCo job (2 replicas, H = 4 inner steps per sync, batches through a real
DataLoader with a worker process) on three controllers that share a real etcd. The leading
controller is SIGKILLed twice, each time in the middle of a sync:
- sync 1: its quorum answered, replica 0 about to all-reduce its pseudo-gradient, nothing
  committed; the sync goes on while no controller leads, and commits (it reports to whoever
  leads next);
- sync 3: replica 0's join waits at the leader for replica 1's; the leader dies with the round
  half joined; both replicas join again at the next leader, which answers the sync.
Each time a standby takes over. Every sync commits once on both replicas (none lost, none
committed twice), training goes on to the end of the job, the global state is bitwise equal on
both replicas after every committed sync, each replica's batches are in the committed history
exactly once, and the last leader's store holds every committed sync and the job's end.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.ha.cluster import ControllerProcess
from tests.runtime import history_checks as hc
from tests.runtime.cluster import Cluster
from tests.runtime.train_worker import BATCH_ROWS
from tests.waiting import wait_until

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

H, SYNCS = 4, 5
IN_ALLREDUCE, IN_QUORUM = 1, 3  # the syncs during which a leader dies
SAMPLES = 2 * SYNCS * H * BATCH_ROWS  # one epoch


def _held(cluster: Cluster, replica: int, phase: str) -> bool:
    path = cluster.records_dir / f"{replica}-0-0.jsonl"
    return path.exists() and f'"event": "held", "phase": "{phase}"' in path.read_text()


def _leader(controllers: list[ControllerProcess]) -> ControllerProcess | None:
    return next((c for c in controllers if c.proc.poll() is None and c.leads()), None)


def _kill(controller: ControllerProcess) -> float:
    controller.signal(signal.SIGKILL)
    controller.proc.wait(timeout=10)
    return time.time()


def test_leading_controllers_killed_inside_two_syncs_lose_no_sync_and_the_job_completes(tmp_path, etcd):
    job = f"diloco-ha-{uuid.uuid4().hex[:8]}"  # the session's etcd: a key prefix of its own
    controllers = [ControllerProcess(etcd.endpoint, replicas=2, name=n, job_id=job, log_path=tmp_path / f"ctl-{n}.log",
                                     extra=("--sync-mode", "diloco", "--sync-every", str(H))).start() for n in "abc"]
    try:
        first = wait_until(lambda: _leader(controllers), 20, "a leader")
        releases = [tmp_path / "release-1", tmp_path / "release-2"]
        cluster = Cluster(tmp_path / "job", replicas=2, ranks=1, steps=SYNCS, module="tests.runtime.semisync_worker",
                          controller_address=",".join(c.grpc for c in sorted(controllers, key=lambda c: c is not first)),
                          worker={"sync_mode": "diloco", "sync_every": H, "job_id": job, "loader_workers": 1,
                                  "samples": SAMPLES},
                          overrides={0: {"holds": [{"phase": "allreduce", "step": IN_ALLREDUCE,
                                                    "release": str(releases[0])}]},
                                     1: {"holds": [{"phase": "quorum", "step": IN_QUORUM,
                                                    "release": str(releases[1])}]}})
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(cluster.run, 150.0)
            wait_until(lambda: running.done() or _held(cluster, 0, "allreduce"), 120, "replica 0 inside sync 1")
            assert not running.done(), running.result()
            killed_at = [_kill(first)]
            releases[0].touch()  # the sync goes on with no controller leading

            def round_half_joined():  # replica 1 held back, replica 0's join waiting at the new leader
                second = _leader(controllers)
                job_view = second and _held(cluster, 1, "quorum") and second.job()
                return job_view and job_view["round"]["joined"] == ["0"] and second
            second = wait_until(lambda: running.done() or round_half_joined(), 60, "sync 3's round half joined")
            assert not running.done(), running.result()
            killed_at.append(_kill(second))
            releases[1].touch()
            rec = running.result(timeout=170)

        [in_allreduce] = rec.where(event="held", phase="allreduce")
        assert (in_allreduce["replica"], in_allreduce["step"]) == ("0", IN_ALLREDUCE)
        commits = rec.where(event="commit")
        for step, dead_at in zip((IN_ALLREDUCE, IN_QUORUM), killed_at):
            # the sync a leader died in committed after its death, on both replicas, with both
            rows = [r for r in commits if r["step"] == step]
            assert sorted(r["replica"] for r in rows) == ["0", "1"], rows
            assert all(r["t"] > dead_at and r["included"] == ["0", "1"] for r in rows), rows
        # the sync in its all-reduce kept the dead leader's quorum
        assert {r["quorum_id"] for r in commits if r["step"] == IN_ALLREDUCE} == {in_allreduce["quorum_id"]}
        # no sync lost, none committed twice; quorum ids never went back
        assert Counter((r["replica"], r["step"]) for r in commits) == {(r, s): 1 for r in "01" for s in range(SYNCS)}
        ids = [r["quorum_id"] for r in sorted(rec.where(event="commit", replica="0"), key=lambda r: r["step"])]
        assert ids == sorted(ids), ids
        assert hc.check_bitwise_identical_after_every_commit(rec) == SYNCS
        batches = hc.check_exactly_once_along(hc.committed_history(rec), rec, ["0", "1"])
        assert sorted(batches) == [(r, p) for r in "01" for p in range(SYNCS * H)]
        assert hc.check_loader_served_ledger_positions(rec, SAMPLES, BATCH_ROWS, 2, 1) == 2 * SYNCS * H
        assert len(rec.where(event="done")) == 2

        [last] = [c for c in controllers if c not in (first, second)]
        assert last.leads()
        job_view = httpx.get(f"{last.http}/api/v1/job", timeout=5).json()
        assert (job_view["job_state"], job_view["committed_step"], job_view["sync_mode"]) == ("COMPLETED", SYNCS - 1,
                                                                                             "diloco")
        assert not job_view["digest_mismatches"]
        replicas = httpx.get(f"{last.http}/api/v1/replicas", timeout=5).json()
        assert {r["replica_id"]: r["committed_step"] for r in replicas} == {"0": SYNCS - 1, "1": SYNCS - 1}
    finally:
        for c in controllers:
            c.stop()
