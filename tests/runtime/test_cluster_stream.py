"""A stream (IterableDataset through torchdata's StatefulDataLoader, two workers) under the runtime,
a trainer SIGKILLed mid-epoch and restarted: exactly once along the committed history, the
restarted replica resumed from its saved stream state, and the replicas agree."""

from __future__ import annotations

import pytest

from tests.runtime import history_checks as hc
from tests.runtime.cluster import Cluster

pytestmark = pytest.mark.slow
pytest.importorskip("torchdata.stateful_dataloader")

SAMPLES, REPLICAS = 96, 3


def test_a_stream_killed_mid_epoch_resumes_from_its_saved_state_exactly_once(tmp_path):
    from fthsdp.data import ReplicaShard
    from fthsdp.data_stream import StreamBatches
    from tests.runtime.stream_worker import StreamSpec, stream_loader

    cluster = Cluster(tmp_path, replicas=REPLICAS, ranks=1, steps=30, join_timeout_s=2.0,
                      module="tests.runtime.stream_worker",
                      worker={"samples": SAMPLES, "stream_dir": str(tmp_path / "streams"), "kill_replica": "1",
                              "kill_after": 12})
    rec = cluster.run(timeout_s=150.0)

    (killed,) = rec.where(event="killed")
    assert (killed["replica"], killed["step"]) == ("1", 13)
    walked = hc.committed_history(rec)
    batches = hc.check_exactly_once_along(walked, rec, [str(r) for r in range(REPLICAS)])
    assert hc.check_bitwise_identical_after_every_commit(rec) == 30
    first = hc.check_restarted_replica_caught_up(rec, "1")
    assert first["positions_before"]["1"] == 13

    # Each included batch held the samples a straight read of that replica's stream has there.
    spec = StreamSpec(SAMPLES, "")
    straight = {}
    for r in range(REPLICAS):
        stream = StreamBatches(stream_loader(spec, ReplicaShard(str(r), r, REPLICAS)), str(r))
        last = max(p for (replica, p) in batches if replica == str(r))
        straight[str(r)] = [stream.batch_at(str(r), p)["index"].tolist() for p in range(last + 1)]
    assert hc.check_included_samples(walked, rec, lambda replica, p: straight[replica][p]) == len(batches)
    # The restarted trainer loaded the state saved before position 12 and read one batch forward,
    # instead of reading its stream again from the start.
    restarted = [r for r in rec.where(event="commit", replica="1") if r["incarnation"] == 1]
    assert (restarted[-1]["restored"], restarted[-1]["skipped"]) == (1, 1)
    assert {3, 6, 9, 12} <= {int(p.stem) for p in (tmp_path / "streams" / "1").glob("*.pt")}
