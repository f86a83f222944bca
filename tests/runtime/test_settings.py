"""RuntimeSettings: validation names the bad value; from_env reads torchrun's variables, FTHSDP_* win."""

from __future__ import annotations

import pytest

from fthsdp.settings import RuntimeSettings
from protos import job_secret
from tests.trainer_secret import ENV as SECRET_ENV
from tests.trainer_secret import SECRET, SECRET_HEX

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500",
            **SECRET_ENV}


@pytest.mark.parametrize("field, value, message", [
    ("world_size", 0, "world_size must be between 1 and 8192, got 0"),
    ("rank", 3, "rank must be in [0, world_size=2), got 3"),
    ("gather_timeout_s", 0, "gather_timeout_s must be a finite number of seconds > 0, got 0"),
    ("quorum_timeout_s", float("inf"), "quorum_timeout_s must be a finite number of seconds > 0, got inf"),
    ("checkpoint_every_steps", 5, "checkpoint_dir must be set"),
    ("max_steps", -1, "max_steps must be >= 0, got -1"),
    ("apply_lr_scale", "yes", "apply_lr_scale must be True or False, got 'yes'"),
    ("coordinator_address", "nohost", "coordinator_address must be host:port, got 'nohost'"),
    ("relay_fanout", -1, "relay_fanout must be 0 (automatic) or a number of ranks >= 1, got -1"),
    ("sync_mode", "async", "sync_mode must be one of sync, local_sgd, diloco, streaming_diloco, got 'async'"),
    ("sync_every_steps", 8, "sync_every_steps=8 needs sync_mode local_sgd, diloco or streaming_diloco"),
    ("sync_fragments", 0, "sync_fragments must be a number of fragments >= 1, got 0"),
    ("sync_fragments", 2, "sync_fragments=2 needs sync_mode streaming_diloco (got 'sync')"),
    ("sync_wire_dtype", "fp8", "sync_wire_dtype must be one of float32, bfloat16, got 'fp8'"),
    ("sync_wire_dtype", "bfloat16", "sync_wire_dtype=bfloat16 needs a semi-synchronous sync_mode"),
    ("sync_every_steps", 0, "sync_every_steps must be a number of inner steps >= 1, got 0"),
    ("outer_lr", -0.5, "outer_lr must be a finite number > 0, got -0.5"),
    ("outer_momentum", 1.0, "outer_momentum must be in [0, 1), got 1.0"),
    ("outer_nesterov", "on", "outer_nesterov must be True or False, got 'on'"),
])
def test_validate_names_bad_values(field, value, message):
    base = dict(controller_address="x:1", world_size=2, coordinator_address="y:2", job_secret=SECRET)
    with pytest.raises(ValueError) as info:
        RuntimeSettings(**{**base, field: value}).validate()
    assert message in str(info.value)


def test_torchrun_variables_fill_rank_world_and_the_coordinator_address():
    s = RuntimeSettings.from_env(TORCHRUN)
    assert (s.rank, s.world_size, s.local_rank, s.coordinator_address) == (1, 2, 1, "10.1.2.3:29501")
    assert s.controller_address == ""  # only rank 0 needs it


def test_fthsdp_variables_win_over_torchrun_and_keywords_over_both():
    env = {**TORCHRUN, "FTHSDP_RANK": "0", "FTHSDP_CONTROLLER": "c:1", "FTHSDP_COORDINATOR_ADDRESS": "h:7",
           "FTHSDP_MAX_STEPS": "50"}
    s = RuntimeSettings.from_env(env, max_steps=60)
    assert (s.rank, s.coordinator_address, s.controller_address, s.max_steps) == (0, "h:7", "c:1", 60)


def test_the_sync_mode_comes_from_the_environment_and_keywords_win():
    env = {**TORCHRUN, "FTHSDP_SYNC_MODE": "diloco", "FTHSDP_SYNC_EVERY_STEPS": "8", "FTHSDP_OUTER_LR": "0.5",
           "FTHSDP_OUTER_MOMENTUM": "0.8", "FTHSDP_OUTER_NESTEROV": "0"}
    s = RuntimeSettings.from_env(env)
    assert (s.sync_mode, s.sync_every_steps, s.outer_lr, s.outer_momentum, s.outer_nesterov) == (
        "diloco", 8, 0.5, 0.8, False)
    assert s.semi_synchronous and not RuntimeSettings.from_env(TORCHRUN).semi_synchronous
    assert RuntimeSettings.from_env(env, sync_mode="local_sgd").sync_mode == "local_sgd"
    with pytest.raises(ValueError, match="FTHSDP_OUTER_NESTEROV='yes' must be 0 or 1"):
        RuntimeSettings.from_env({**env, "FTHSDP_OUTER_NESTEROV": "yes"})
    with pytest.raises(ValueError, match="FTHSDP_OUTER_LR='fast' is not a number"):
        RuntimeSettings.from_env({**env, "FTHSDP_OUTER_LR": "fast"})


@pytest.mark.parametrize("drop, named", [("MASTER_ADDR", "MASTER_ADDR is not set on this rank"),
                                         ("MASTER_PORT", "MASTER_PORT is not set on this rank")])
def test_a_missing_torchrun_variable_is_named(drop, named):
    env = {k: v for k, v in TORCHRUN.items() if k != drop}
    with pytest.raises(ValueError, match=named):
        RuntimeSettings.from_env(env)


def test_without_a_job_secret_the_settings_say_how_to_give_one_or_to_run_insecure():
    env = {k: v for k, v in TORCHRUN.items() if k != job_secret.ENV_JOB_SECRET}
    with pytest.raises(ValueError, match="FTHSDP_JOB_SECRET_FILE=PATH .* FTHSDP_JOB_SECRET=HEX .* "
                                         "FTHSDP_INSECURE_TRAINER_PORTS=1") as info:
        RuntimeSettings.from_env(env)
    assert "openssl rand -hex 32" in str(info.value)
    insecure = RuntimeSettings.from_env({**env, job_secret.ENV_INSECURE_TRAINER_PORTS: "1"})
    assert insecure.job_secret is None and insecure.port_key(job_secret.PURPOSE_FTAR) is None
    with pytest.raises(ValueError, match="FTHSDP_INSECURE_TRAINER_PORTS must be 1 .* got 'yes'"):
        RuntimeSettings.from_env({**env, job_secret.ENV_INSECURE_TRAINER_PORTS: "yes"})


def test_the_secret_file_wins_over_the_variable_and_never_shows(tmp_path):
    other = job_secret.generate()
    (tmp_path / "secret").write_text(other + "\n")
    s = RuntimeSettings.from_env({**TORCHRUN, job_secret.ENV_JOB_SECRET_FILE: str(tmp_path / "secret")})
    assert s.job_secret == job_secret.parse(other, "x") and s.job_secret != SECRET
    assert other not in repr(s) and SECRET_HEX not in repr(RuntimeSettings.from_env(TORCHRUN))
    keys = {s.port_key(p) for p in (job_secret.PURPOSE_COORDINATOR, job_secret.PURPOSE_FTAR, job_secret.PURPOSE_STATE)}
    assert len(keys) == 3 and all(len(k) == 32 for k in keys)  # one key per port


@pytest.mark.parametrize("text, named", [("abc", "odd number of hex digits"), ("zz" * 32, "character 1 of 64"),
                                         ("ab" * 16, "is 16 bytes; it must be 32 to 512")])
def test_a_bad_secret_is_refused_without_showing_it(text, named):
    with pytest.raises(ValueError, match=named) as info:
        RuntimeSettings.from_env({**TORCHRUN, job_secret.ENV_JOB_SECRET: text})
    assert text not in str(info.value)


def test_a_secret_file_that_is_missing_or_huge_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"cannot read the job secret from file {tmp_path / 'nope'}"):
        RuntimeSettings.from_env({**TORCHRUN, job_secret.ENV_JOB_SECRET_FILE: str(tmp_path / "nope")})
    (tmp_path / "big").write_text("ab" * 5000)
    with pytest.raises(ValueError, match="larger than 2048 bytes"):
        RuntimeSettings.from_env({**TORCHRUN, job_secret.ENV_JOB_SECRET_FILE: str(tmp_path / "big")})


def test_rank_0_without_a_controller_is_told_which_variable_to_set():
    with pytest.raises(ValueError, match="controller_address must be set on rank 0.*FTHSDP_CONTROLLER"):
        RuntimeSettings.from_env({**TORCHRUN, "RANK": "0"})


def test_a_multi_rank_replica_without_any_coordinator_address_is_refused():
    with pytest.raises(ValueError, match="set FTHSDP_COORDINATOR_ADDRESS, or torchrun's MASTER_ADDR and MASTER_PORT"):
        RuntimeSettings.from_env({"RANK": "1", "WORLD_SIZE": "2", **SECRET_ENV})


def test_a_single_rank_replica_needs_no_coordinator_address():
    assert RuntimeSettings.from_env({"FTHSDP_CONTROLLER": "c:1", **SECRET_ENV}).coordinator_address == ""


@pytest.mark.parametrize("env, named", [({"RANK": "one"}, "RANK='one' is not a number"),
                                        ({**TORCHRUN, "MASTER_PORT": "65535"}, "MASTER_PORT='65535'")])
def test_unparsable_variables_are_named(env, named):
    with pytest.raises(ValueError, match=named):
        RuntimeSettings.from_env(env)


def test_relays_come_above_64_ranks_unless_the_fanout_says_otherwise():
    base = dict(controller_address="x:1", coordinator_address="y:2", job_secret=SECRET)
    assert RuntimeSettings(**base, world_size=64).validate().relay_tree().relays == ()
    assert RuntimeSettings(**base, world_size=8192).validate().relay_tree().fanout == 91
    assert RuntimeSettings(**base, world_size=8192, relay_fanout=8192).validate().relay_tree().relays == ()
    assert RuntimeSettings(**base, world_size=9, relay_fanout=3).validate().relay_tree().relays == (3, 6)
    with pytest.raises(ValueError, match="relay_fanout must be at most 1024 ranks per relay .* got 2000"):
        RuntimeSettings(**base, world_size=4096, relay_fanout=2000).validate()
    assert RuntimeSettings.from_env({**TORCHRUN, "FTHSDP_RELAY_FANOUT": "3"}).relay_fanout == 3
