"""Real processes: a DiLoCo job (2 replicas, H = 4 inner steps per sync) on two controllers that
share a real etcd; the leading controller is SIGKILLed in the middle of a sync -- its quorum
answered, its pseudo-gradient's all-reduce not yet started, nothing committed -- and the standby
takes over. The sync commits once (it is not lost, nor committed twice), training goes on
through the new leader to the end of the job, the global state is bitwise equal on both
replicas after every committed sync, each replica's batches (through a real DataLoader with
worker processes) are in the committed history exactly once, and the new leader's store holds
every committed sync and the job's end.
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

H, SYNCS, HELD = 4, 4, 1  # the sync during which the leader dies
SAMPLES = 2 * SYNCS * H * BATCH_ROWS  # one epoch


def test_the_leading_controller_killed_during_a_sync_loses_no_sync_and_the_job_completes(tmp_path, etcd):
    job = f"diloco-ha-{uuid.uuid4().hex[:8]}"  # the session's etcd: a key prefix of its own
    controllers = [ControllerProcess(etcd.endpoint, replicas=2, name=n, job_id=job, log_path=tmp_path / f"ctl-{n}.log",
                                     extra=("--sync-mode", "diloco", "--sync-every", str(H))).start() for n in "ab"]
    try:
        leader = wait_until(lambda: next((c for c in controllers if c.leads()), None), 20, "a leader")
        [standby] = [c for c in controllers if c is not leader]
        release = tmp_path / "release"
        cluster = Cluster(tmp_path / "job", replicas=2, ranks=1, steps=SYNCS,
                          controller_address=f"{leader.grpc},{standby.grpc}", module="tests.runtime.semisync_worker",
                          worker={"sync_mode": "diloco", "sync_every": H, "job_id": job, "loader_workers": 1,
                                  "samples": SAMPLES},
                          overrides={0: {"hold_at": HELD, "hold_release": str(release)}})
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(cluster.run, 150.0)
            held = cluster.records_dir / "0-0-0.jsonl"
            wait_until(lambda: running.done() or (held.exists() and '"event": "syncing"' in held.read_text()),
                       120, "replica 0 inside sync 1")
            assert not running.done(), running.result()
            leader.signal(signal.SIGKILL)
            leader.proc.wait(timeout=10)
            killed_at = time.time()
            release.touch()  # the sync goes on with no controller leading
            rec = running.result(timeout=170)

        [syncing] = rec.where(event="syncing")
        assert syncing["step"] == HELD
        commits = rec.where(event="commit")
        held_commits = [r for r in commits if r["step"] == HELD]
        # the sync the leader died in committed after its death, on both replicas, with both
        assert {r["replica"] for r in held_commits} == {"0", "1"}
        assert all(r["t"] > killed_at and r["included"] == ["0", "1"] for r in held_commits), held_commits
        assert {r["quorum_id"] for r in held_commits} == {syncing["quorum_id"]}  # the old leader's quorum
        # no sync lost, none committed twice; the new leader's quorum ids never went back
        assert Counter((r["replica"], r["step"]) for r in commits) == {(r, s): 1 for r in "01" for s in range(SYNCS)}
        ids = [r["quorum_id"] for r in sorted(rec.where(event="commit", replica="0"), key=lambda r: r["step"])]
        assert ids == sorted(ids), ids
        assert hc.check_bitwise_identical_after_every_commit(rec) == SYNCS
        walked = hc.committed_history(rec)
        batches = hc.check_exactly_once_along(walked, rec, ["0", "1"])
        assert sorted(batches) == [(r, p) for r in "01" for p in range(SYNCS * H)]
        assert hc.check_loader_served_ledger_positions(rec, SAMPLES, BATCH_ROWS, 2, 1) == 2 * SYNCS * H
        assert len(rec.where(event="done")) == 2

        assert standby.leads()
        job_view = httpx.get(f"{standby.http}/api/v1/job", timeout=5).json()
        assert (job_view["job_state"], job_view["committed_step"], job_view["sync_mode"]) == ("COMPLETED", SYNCS - 1,
                                                                                             "diloco")
        assert not job_view["digest_mismatches"]
        replicas = httpx.get(f"{standby.http}/api/v1/replicas", timeout=5).json()
        assert {r["replica_id"]: r["committed_step"] for r in replicas} == {"0": SYNCS - 1, "1": SYNCS - 1}
    finally:
        for c in controllers:
            c.stop()
