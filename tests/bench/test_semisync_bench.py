"""bench.semisync at a tiny size: it starts the controller and the replicas on the slowed link (veth + tbf
where the machine allows, else the token bucket), and prints one JSON line per configuration with the bytes,
the rate and the held-out loss against the synchronous band; its configurations and its link."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import semisync
from bench.semisync_link import open_link, veth_unavailable
from tests.bench import smoke
from tests.chaos.network import list_namespaces, run

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)  # two or three configurations, each a controller and two trainer processes (a loaded machine)
def test_bench_semisync_prints_one_line_per_configuration_on_the_slowed_link():
    lines = smoke.check("semisync")  # tests/bench/smoke.py's row: each line checked against FIELDS
    sync, diloco, streaming = lines
    assert (sync["mode"], sync["sync_every"], diloco["mode"], diloco["sync_every"]) == ("sync", 1, "diloco", 4)
    assert sync["commits"] == 8 and diloco["commits"] == 2  # one sync per 4 inner steps
    assert sync["sync_wire_dtype"] == diloco["sync_wire_dtype"] == "float32"  # the default, as the trainers hold it
    assert sync["samples_per_replica"] == diloco["samples_per_replica"] == 32  # equal samples
    assert 0 < diloco["bytes_across_replicas_per_sample"] < 0.5 * sync["bytes_across_replicas_per_sample"]
    assert diloco["samples_per_s"] > 0 and diloco["replicas_agree"] and sync["replicas_agree"]
    if veth_unavailable():
        assert diloco["link"].startswith("token bucket in the FTAR transport") and diloco["wire_bytes_per_sample"] is None
    else:  # every FTAR byte crossed the replicas' veths (with its headers and the control traffic)
        assert diloco["link"] == "veth+tbf 1000MB/s"
        assert diloco["wire_bytes_per_sample"] > diloco["bytes_across_replicas_per_sample"]
    # one seed: the band is the synchronous run's own loss, and each line says where it falls
    assert sync["sync_seeds"] == 1 and sync["heldout_loss_sync_band"] == [sync["heldout_loss"]] * 2
    assert sync["heldout_vs_sync_band"] == "inside" and diloco["heldout_loss_sync"] == sync["heldout_loss"]
    assert diloco["heldout_vs_sync_band"] == semisync.band_position(diloco["heldout_loss"], [sync["heldout_loss"]] * 2)
    assert diloco["torchft"] == "not run: --no-torchft" and diloco["samples_per_s_torchft"] is None
    assert (streaming["mode"], streaming["sync_every"], streaming["sync_fragments"]) == ("streaming_diloco", 4, 2)
    assert streaming["replicas_agree"] and streaming["samples_per_replica"] == 32
    assert 0 < streaming["bytes_across_replicas_per_sample"] < 0.5 * sync["bytes_across_replicas_per_sample"]
    # K = H / F = 2 inner steps per fragment sync: the runtime's default overlap of 1; the others block
    assert (streaming["sync_overlap_steps"], diloco["sync_overlap_steps"], sync["sync_overlap_steps"]) == (1, 0, 0)
    assert set(streaming["time_per_sync_s"]) == {"sync_s", "runtime_s", "compute_s"}
    # DiLoCo's quorum asked for one inner step ahead (--plan-ahead-steps 1); a share of its 2 plans in by the due step
    assert (diloco["sync_plan_ahead_steps"], streaming["sync_plan_ahead_steps"], sync["sync_plan_ahead_steps"]) == (1, 0, 0)
    assert diloco["plans_in_at_due"] in (0.0, 0.5, 1.0) and streaming["plans_in_at_due"] is sync["plans_in_at_due"] is None
    assert sync["inner_optimizer"] == diloco["inner_optimizer"] == "adamw_fused"  # --inner-optimizer, on every line


@pytest.mark.parametrize("args, says", [
    (("--steps", "10", "--configs", "diloco:4"), "'diloco:4': H must be >= 1 and divide --steps 10"),
    (("--threads", "0"), "--threads >= 1, got 2, 1, 50, 0"),
])
def test_bench_semisync_refuses_bad_arguments_naming_them(args, says):
    out = subprocess.run([sys.executable, "-m", "bench.semisync", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and says in out.stderr


@pytest.mark.parametrize("text, problem", [
    ("diloco", "'diloco' is not mode:H or mode:H:F"),
    ("adam:8", "'adam:8': the mode must be one of"),
    ("sync:2", "'sync:2': sync meets every step"),
    ("diloco:8:2", "'diloco:8:2': fragments F > 1 need streaming_diloco"),
    ("streaming_diloco:8:3", "'streaming_diloco:8:3'"),  # F does not divide H (or the mode is not there yet)
    ("diloco:0", "'diloco:0': H must be >= 1"),
])
def test_configurations_name_each_bad_one(text, problem):
    with pytest.raises(ValueError, match="--configs: .*" + problem.replace("(", r"\(")):
        semisync.parse_configs(f"local_sgd:8,{text}", 64)


def test_configurations_start_with_sync_once_and_keep_their_order():
    assert semisync.parse_configs("diloco:8,local_sgd:4,sync:1,diloco:8", 64) == [
        semisync.SYNC, semisync.Config("diloco", 8), semisync.Config("local_sgd", 4)]
    assert semisync.Config("streaming_diloco", 8, 2).label == "streaming_diloco:8:2"
    assert "streaming_diloco:8:2" in semisync.DEFAULT_CONFIGS


def test_a_loss_falls_below_inside_or_above_the_sync_band():
    band = [0.5, 0.7]
    assert [semisync.band_position(x, band) for x in (0.4, 0.5, 0.6, 0.7, 0.8)] == [
        "below", "inside", "inside", "inside", "above"]


def test_the_veth_link_caps_every_replica_at_the_rate_or_is_refused_naming_why():
    why = veth_unavailable()
    if why:
        with pytest.raises(ValueError, match="--link veth cannot be built here: " + why):
            open_link("veth", 2, 50)
        assert open_link("auto", 2, 50).name.endswith(f"(no veth: {why})")
        return
    link = open_link("auto", 2, 50)
    try:
        assert link.name == "veth+tbf 50MB/s" and link.replica_host(0) != link.replica_host(1)
        namespaces = [link.net.node(link.replica_node(r)).namespace for r in range(2)]
        for ns in namespaces:  # 50 MB/s = 400 Mbit/s on the replica's own end
            assert "tbf" in run("tc", "qdisc", "show", "dev", "eth0", namespace=ns)
            assert "rate 400Mbit" in run("tc", "qdisc", "show", "dev", "eth0", namespace=ns)
        assert link.wire_bytes(0) >= 0
    finally:
        link.close()
    assert not set(namespaces) & set(list_namespaces())  # nothing of the run is left behind


def test_a_link_kind_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="--link must be one of auto, veth, bucket, got 'wan'"):
        open_link("wan", 2, 50)
