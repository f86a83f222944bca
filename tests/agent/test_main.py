"""The command line: flags to settings, and bad values refused with exit status 2."""

from __future__ import annotations

import pytest

from agent.main import main, parse


def test_flags_become_settings():
    s = parse(["--controller", "127.0.0.1:1,127.0.0.1:2", "--host-id", "h1", "--replica-id", "r3",
               "--ranks", "0,1", "--world-size", "2", "--labels", "zone=a,rack=3",
               "--standby-restart-budget", "0", "--standby-restart-window-s", "60", "--",
               "python", "train.py", "--rank={rank}", "--", "x"])
    assert s.controller_addresses == ("127.0.0.1:1", "127.0.0.1:2")
    assert (s.replica_id, s.ranks, s.world_size, s.slot_count) == ("r3", (0, 1), 2, 2)
    assert s.labels == {"zone": "a", "rack": "3"}
    assert (s.restart_budget, s.restart_window_s) == (0, 60.0)
    assert s.command == ("python", "train.py", "--rank={rank}", "--", "x")
    assert not s.tls.enabled
    assert not s.warm_restarts  # off unless asked for
    assert parse(["--controller", "127.0.0.1:1", "--host-id", "h1", "--warm-restarts", "--", "t"]).warm_restarts


@pytest.mark.parametrize("argv,words", [
    (["--controller", "127.0.0.1:1", "--host-id", "h1", "--spare"], "command template"),
    (["--controller", "127.0.0.1:1", "--host-id", "h1", "--spare", "--standby", "--", "t",
      "{replica_id}"], "cannot use ['replica_id']"),
    # A reserve (warm restarts) starts before it knows its rank, as a standby does.
    (["--controller", "127.0.0.1:1", "--host-id", "h1", "--replica-id", "r0", "--ranks", "0", "--world-size", "1",
      "--warm-restarts", "--", "t", "--rank={rank}"], "cannot use ['rank']"),
    (["--controller", "127.0.0.1:1", "--host-id", "h1", "--warm-restarts", "--reserve-delay-s", "-1", "--", "t"],
     "reserve_delay_s must be 0..3600, got -1.0"),
    (["--controller", "127.0.0.1:1", "--host-id", "h1", "--spare", "--tls-cert-file", "@c",
      "--tls-key-file", "@k", "--", "t"], "needs TLS"),
])
def test_bad_settings_exit_2_naming_the_value(argv, words, capsys, tmp_path):
    for name in "ck":  # files that exist (the flags check that), without a CA to make them TLS
        (tmp_path / name).write_text("PEM")
    argv = [str(tmp_path / a[1:]) if a in ("@c", "@k") else a for a in argv]
    assert main(argv) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--controller", "nowhere", "--host-id", "h1", "--spare", "--", "t"],
    ["--controller", "127.0.0.1:1", "--host-id", "h1", "--labels", "zone", "--spare", "--", "t"],
    ["--controller", "127.0.0.1:1", "--host-id", "h1", "--ranks", "0,x", "--", "t"],
])
def test_malformed_flags_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    assert "error" in capsys.readouterr().err


def test_an_active_host_may_leave_its_assignment_to_the_controller():
    s = parse(["--controller", "127.0.0.1:1", "--host-id", "h1", "--", "t"])
    assert not s.spare and s.replica_id == ""
