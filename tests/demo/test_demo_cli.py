"""`fthsdp demo` as a subprocess: a small faulty run end to end, and bad input."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

FTHSDP = str(Path(sys.executable).with_name("fthsdp"))
HEARTBEAT_TIMEOUT_S = 2.0


def run_demo(out: Path, *flags: str, timeout_s: float) -> tuple[subprocess.CompletedProcess, dict]:
    """`fthsdp demo FLAGS --out OUT` to its end (it must pass); its output and report.json."""
    proc = subprocess.run([FTHSDP, "demo", *flags, "--out", str(out)], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc, json.loads((out / "report.json").read_text())


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_demo_with_a_dead_host_and_a_killed_trainer(tmp_path):
    out = tmp_path / "report"
    # The host dies first (a warm spare takes over in seconds); the trainer kill waits until
    # every replica is healthy again, and its cold restart takes longest.
    proc = subprocess.run(
        [FTHSDP, "demo", "--replicas", "3", "--steps", "40", "--step-time-s", "0.15",
         "--failures", "kill-agent@5:r2,kill-trainer@12:r1", "--heartbeat-timeout-s", str(HEARTBEAT_TIMEOUT_S),
         "--no-baseline", "--out", str(out), "--timeout-s", "150"],
        capture_output=True, text=True, timeout=190, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    report = json.loads((out / "report.json").read_text())
    assert all(report["checks"].values()), report["checks"]
    assert report["checks"]["exactly_once"] is True and report["checks"]["bitwise_identical"] is True
    assert report["steps"] >= 40 and report["baseline"] is None
    assert report["history"]["steps"] == report["steps"]  # one committed chain, step 0 to the end
    assert [(f["kind"], f["replica"]) for f in report["failures"]] == [("kill-agent", "r2"), ("kill-trainer", "r1")]
    for f in report["failures"]:
        assert 0 < f["detection_s"] <= f["detection_bound_s"] == HEARTBEAT_TIMEOUT_S + 1.5
        assert f["detection_s"] < f["rejoin_s"]
    assert report["failures"][0]["detected_by"] in ("host", "heartbeat")
    assert report["failures"][1]["detected_by"] == "trainer_exit"
    assert 0 < report["effective_training_time"] < 1
    assert 0.5 < report["final"]["test_accuracy"] <= 1 and report["final"]["test_loss"] > 0
    for name in ("loss.png", "healthy_replicas.png"):
        width, height = _png_size(out / name)
        assert width > 100 and height > 100
    assert "kill-agent r2: SIGKILL host" in proc.stdout


@pytest.mark.parametrize("failures, named", [
    ("kill-trainer@40:r1,explode@50:r2", "'explode@50:r2'"),
    ("kill-trainer@40:r7", "'kill-trainer@40:r7'"),
    ("kill-trainer@999:r1", "'kill-trainer@999:r1'"),
])
def test_bad_schedule_exits_2_naming_the_entry(tmp_path, failures, named):
    proc = subprocess.run([FTHSDP, "demo", "--failures", failures, "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2
    assert "bad --failures" in proc.stderr and named in proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_diloco_demo_kills_a_host_in_a_sync_and_a_trainer_between_syncs(tmp_path):
    """`fthsdp demo --sync diloco --sync-every 8` with its default failures, small: 3 replicas, 12 syncs."""
    proc, report = run_demo(tmp_path / "report", "--sync", "diloco", "--sync-every", "8", "--replicas", "3",
                            "--steps", "96", "--step-time-s", "0.1", "--heartbeat-timeout-s", str(HEARTBEAT_TIMEOUT_S),
                            "--no-baseline", "--timeout-s", "300", timeout_s=390)
    assert all(report["checks"].values()), report["checks"]
    assert report["sync"]["mode"] == "diloco" and report["sync"]["every_steps"] == 8
    assert "mode diloco, a sync every 8 training steps" in proc.stdout
    host, trainer = report["failures"]
    assert (host["kind"], host["replica"], host["training_step"]) == ("kill-agent", "r2", 24)
    assert (trainer["kind"], trainer["replica"], trainer["training_step"]) == ("kill-trainer", "r1", 60)
    # the host died in a sync (its all-reduce held open for it): that round's 8 batches were lost;
    # the trainer in an inner step: the batches since its last sync; the history trained each again
    assert host["landed"].startswith("in sync ") and len(host["lost_batches"]) == 8, host["landed"]
    # ... so the survivors' attempt of that sync failed: the trainers write each retried attempt
    assert report["retries"] >= 1, report["retries"]
    assert trainer["landed"].startswith("in inner step 4 of 8") and len(trainer["lost_batches"]) == 5
    assert report["checks"]["lost_batches_served_again"] and report["checks"]["identical_after_every_commit"]
    assert report["history"]["steps"] == report["steps"] >= 12  # one committed chain of syncs


@pytest.mark.parametrize("flags, named", [
    (["--sync-every", "8"], "--sync-every 8 needs --sync local_sgd or diloco"),
    (["--sync", "diloco", "--sync-every", "0"], "--sync-every must be between 1 and --steps (200), got 0"),
    (["--sync", "local_sgd", "--outer-lr", "0.5"], "--outer-lr needs --sync diloco"),
    (["--sync", "diloco", "--outer-momentum", "1.0"], "--outer-momentum must be in [0, 1), got 1.0"),
    (["--sync", "diloco", "--outer-lr", "nan"], "--outer-lr must be a finite number > 0, got nan"),
    (["--sync", "diloco", "--sync-fragments", "2"], "--sync-fragments 2 needs --sync streaming_diloco"),
    (["--sync", "streaming_diloco", "--sync-every", "6", "--sync-fragments", "4"],
     "--sync-every 6 must be a multiple of --sync-fragments 4"),
    (["--sync", "streaming_diloco", "--sync-fragments", "0"], "--sync-fragments must be >= 1, got 0"),
    (["--sync", "streaming_diloco", "--sync-fragments", "8"], "--sync-fragments 8 is more than the mlp model's 4"),
    (["--sync", "diloco", "--failures", "sdc@40:r1"], "'sdc@40:r1' is a host for the diagnosis"),
])
def test_bad_sync_flags_exit_2_naming_the_value(tmp_path, capsys, flags, named):
    from fthsdp.demo.cli import main

    assert main([*flags, "--out", str(tmp_path / "r")]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_an_unknown_sync_mode_is_an_argparse_error(capsys):
    from fthsdp.demo.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--sync", "gossip"])
    assert exit_.value.code == 2 and "invalid choice: 'gossip'" in capsys.readouterr().err


def test_the_trainers_get_the_mode_in_their_environment_and_the_choices_follow_the_runtime():
    from fthsdp.demo.cli import parser
    from fthsdp.demo.run import RunSettings
    from protos.sync_modes import SYNC_MODES

    base = RunSettings(replicas=4, ranks_per_replica=1, steps=25, seed=0, lr_policy="sqrt")
    assert base.sync_environment() == {}  # every step: the runtime's default
    diloco = RunSettings(**{**base.__dict__, "sync_mode": "diloco", "sync_every": 8, "outer_lr": 0.5})
    assert diloco.sync_environment() == {"FTHSDP_SYNC_MODE": "diloco", "FTHSDP_SYNC_EVERY_STEPS": "8",
                                         "FTHSDP_OUTER_LR": "0.5"}
    streaming = RunSettings(**{**diloco.__dict__, "sync_mode": "streaming_diloco", "sync_fragments": 4})
    assert streaming.sync_environment()["FTHSDP_SYNC_FRAGMENTS"] == "4"
    assert "4 fragments" in streaming.describe_mode() and "lr 0.5, momentum 0.9" in streaming.describe_mode()
    [sync] = [a for a in parser()._actions if a.dest == "sync"]
    assert tuple(sync.choices) == SYNC_MODES


def test_streaming_counts_syncs_of_k_steps_and_the_controller_agrees_with_the_trainers():
    """streaming_diloco, H = 8, F = 2: a sync (one protocol step) is K = 4 training steps; the
    controller's flags (parsed by the controller's own parser) say the same mode, H and F as the
    trainers' environment (the runtime's own reading), or every trainer would be refused."""
    from controller.main import parse_args
    from controller.settings import ControllerSettings
    from fthsdp.demo.run import RunSettings, _due, _in_sync
    from fthsdp.demo.schedule import Failure
    from fthsdp.settings import ENV_INSECURE_TRAINER_PORTS, RuntimeSettings

    s = RunSettings(replicas=3, ranks_per_replica=1, steps=24, seed=0, lr_policy="sqrt", sync_mode="streaming_diloco",
                    sync_every=8, sync_fragments=2)
    assert s.steps_per_sync == 4 and s.describe_steps() == "24 syncs of 4 training steps (96 steps)"
    assert s.sync_view()["steps_per_sync"] == 4 and "a sync of one fragment every 4" in s.describe_mode()
    args = parse_args(["--job-id", "demo", *s.controller_flags()])
    assert (args.sync_mode, args.sync_every, args.sync_fragments) == ("streaming_diloco", 8, 2)
    ControllerSettings(sync_mode=args.sync_mode, sync_every_steps=args.sync_every,
                       sync_fragments=args.sync_fragments).validate()
    trainer_env = {**s.sync_environment(), ENV_INSECURE_TRAINER_PORTS: "1"}  # no ports are opened here
    runtime = RuntimeSettings.from_env(trainer_env, job_id="demo", replica_id="r0",
                                       controller_address="127.0.0.1:1", coordinator_address="127.0.0.1:2")
    assert (runtime.sync_mode, runtime.sync_every_steps, runtime.sync_fragments) == ("streaming_diloco", 8, 2)
    assert runtime.inner_steps_per_sync == s.steps_per_sync  # the trainer's "batches" per commit
    # a kill at training step 20 (a multiple of K, not of H) lands in sync 4, armed from sync 3
    assert _in_sync(Failure("kill-agent", 20, "r2"), s) and _due(Failure("kill-agent", 20, "r2"), s) == 3
    assert not _in_sync(Failure("kill-trainer", 22, "r1"), s) and _due(Failure("kill-trainer", 22, "r1"), s) == 5
    plain = RunSettings(**{**s.__dict__, "sync_mode": "diloco", "sync_fragments": 1})
    assert plain.steps_per_sync == 8 and plain.controller_flags()[-2:] == ("--sync-fragments", "1")
    assert RunSettings(**{**s.__dict__, "sync_mode": "sync", "sync_every": 1, "sync_fragments": 1}
                       ).controller_flags() == ()


def test_the_fragment_limit_is_each_models_trainable_tensors():
    """A model cut into more fragments than it has parameter tensors is refused by the runtime in
    every trainer (a crash loop): the demo refuses it first, by the models' real counts."""
    from fthsdp.demo.cli import TRAINABLE_TENSORS
    from fthsdp.demo.gpt import GptConfig, TinyGPT
    from fthsdp.demo.workloads import build_mlp
    from fthsdp.sync.outer import fragments_of

    for name, model in (("mlp", build_mlp(32)), ("gpt", TinyGPT(GptConfig()))):
        sizes = [p.numel() for p in model.parameters() if p.requires_grad]
        assert TRAINABLE_TENSORS[name] == len(sizes), name
        assert len(fragments_of(sizes, TRAINABLE_TENSORS[name])) == len(sizes)
