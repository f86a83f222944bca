"""The timeout hierarchy in real processes: `fthsdp controller` and `fthsdp agent` refuse a
broken rule at start (exit 2, both values named, nothing served), a trainer's settings from
the environment are refused alike, and `fthsdp timeouts` prints a configuration with a
verdict per rule (exit 1 when one is broken, 2 for bad input, `--json` for machines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from protos import timeout_rules as tr

CLI = [sys.executable, "-m", "fthsdp.cli"]
#: no FTHSDP_* timeout of the test's own environment leaks into the commands
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_")}


def run(*argv: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**CLEAN_ENV, **(env or {})}, cwd=cwd)


def test_the_controller_refuses_a_heartbeat_timeout_below_a_reconnect_cycle_naming_both_values():
    out = run("controller", "--insecure", "--grpc-port", "0", "--http-port", "0", "--event-log", "off",
              "--join-timeout-s", "30", "--heartbeat-timeout-s", "1.5")
    assert out.returncode == 2, out.stderr
    assert ("heartbeat_timeout_s (1.5 s) must be at least client_backoff_cap_s (1 s) + client_call_s (1 s) = 2 s"
            in out.stderr)
    assert out.stdout == ""  # never served: the "serving" line is its first


def test_the_controller_refuses_a_rule_broken_between_its_settings_file_and_a_flag(tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps({"client_backoff_cap_s": 4.0}))
    out = run("controller", "--insecure", "--grpc-port", "0", "--http-port", "0", "--event-log", "off",
              "--settings", str(tmp_path / "settings.json"), "--heartbeat-timeout-s", "4.5")
    assert out.returncode == 2 and "heartbeat_timeout_s (4.5 s) must be at least client_backoff_cap_s (4 s)" \
        in out.stderr, out.stderr


def test_a_timeout_flag_that_is_not_a_positive_number_is_an_argparse_error():
    out = run("controller", "--join-timeout-s", "-1")
    assert out.returncode == 2 and "--join-timeout-s: '-1' is not a number of seconds above 0" in out.stderr
    out = run("agent", "--controller", "127.0.0.1:1", "--host-id", "h", "--heartbeat-interval-s", "soon", "--", "true")
    assert out.returncode == 2 and "--heartbeat-interval-s: 'soon' is not a number of seconds above 0" in out.stderr


def test_the_agent_refuses_a_heartbeat_that_its_call_timeout_cannot_cover():
    out = run("agent", "--controller", "127.0.0.1:1", "--host-id", "h", "--insecure",
              "--heartbeat-interval-s", "3", "--", "true")
    assert out.returncode == 2, out.stderr
    assert "rpc_timeout_s (5 s) must be at least 2 × heartbeat_interval_s (3 s) = 6 s" in out.stderr
    assert "registered" not in out.stdout


def test_a_trainer_refuses_runtime_timeouts_from_its_environment_naming_both_values():
    code = "from fthsdp.settings import RuntimeSettings; RuntimeSettings.from_env()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**CLEAN_ENV, "FTHSDP_CONTROLLER": "127.0.0.1:1", "FTHSDP_INSECURE_TRAINER_PORTS": "1",
                              "FTHSDP_GATHER_TIMEOUT_S": "0.05", "FTHSDP_ALLREDUCE_TIMEOUT_S": "1000"})
    assert out.returncode == 1
    assert "gather_timeout_s (0.05 s) must be at least allreduce_timeout_s (1000 s)" in out.stderr


def test_timeouts_prints_every_process_and_every_rule_and_passes_the_defaults():
    out = run("timeouts")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line for line in lines if line and not line.startswith(" ")] == [
        "controller", "agent", "runtime", "rules", f"all {len(tr.RULES)} rules hold"]
    join = next(line for line in lines if line.strip().startswith("join_timeout_s"))
    assert join.split()[1:4] == ["5", "s", "default"]
    assert sum(line.startswith("  ok ") for line in lines) == len(tr.RULES)


def test_timeouts_accepts_a_long_join_beside_a_short_heartbeat():
    """No rule orders join and heartbeat timeouts: a silent replica stops being awaited once the
    heartbeat timeout declares it dead; the join timeout bounds the wait for live ones."""
    out = run("timeouts", "--join-timeout-s", "30", "--heartbeat-timeout-s", "3")
    assert out.returncode == 0, out.stdout
    assert "--join-timeout-s" in next(line for line in out.stdout.splitlines() if "join_timeout_s " in line)


def test_timeouts_exits_1_naming_both_values_of_each_broken_rule():
    out = run("timeouts", "--heartbeat-timeout-s", "3", "--heartbeat-interval-s", "2",
              env={"FTHSDP_GATHER_TIMEOUT_S": "0.05", "FTHSDP_ALLREDUCE_TIMEOUT_S": "1000"})
    assert out.returncode == 1, out.stderr
    assert "  BROKEN runtime.gather_timeout_s >= runtime.allreduce_timeout_s" in out.stdout
    assert "runtime.gather_timeout_s (0.05 s) must be at least runtime.allreduce_timeout_s (1000 s)" in out.stdout
    assert ("controller.heartbeat_timeout_s (3 s) must be at least 3 × agent.heartbeat_interval_s (2 s) = 6 s"
            in out.stdout)
    assert out.stdout.rstrip().endswith(f"2 of {len(tr.RULES)} rules broken")
    gather = next(line for line in out.stdout.splitlines() if line.strip().startswith("gather_timeout_s"))
    assert "FTHSDP_GATHER_TIMEOUT_S" in gather


def test_timeouts_json_for_machines(tmp_path):
    (tmp_path / "settings.json").write_text(json.dumps({"rollback_wait_s": 50.0, "diagnosis": {"hang_after_s": 9.0}}))
    out = run("timeouts", "--json", "--settings", str(tmp_path / "settings.json"), env={"FTHSDP_QUORUM_TIMEOUT_S": "40"})
    assert out.returncode == 1, out.stderr
    found = json.loads(out.stdout)
    assert set(found["processes"]) == set(tr.PROCESSES)
    assert found["processes"]["controller"]["rollback_wait_s"] == {
        "value_s": 50.0, "source": "--settings", "bounds": tr.WAITS["controller.rollback_wait_s"]}
    assert found["processes"]["controller"]["diagnosis.hang_after_s"]["source"] == "--settings"
    assert found["processes"]["controller"]["diagnosis.analysis_interval_s"]["source"] == "default"
    assert found["processes"]["runtime"]["quorum_timeout_s"]["source"] == "FTHSDP_QUORUM_TIMEOUT_S"
    (broken,) = [r for r in found["rules"] if not r["ok"]]
    assert broken["larger"] == "runtime.quorum_timeout_s" and found["broken"] == 1
    assert "runtime.quorum_timeout_s (40 s) must be at least controller.join_timeout_s (5 s) + " \
           "controller.rollback_wait_s (50 s) = 55 s" in broken["message"]


def test_timeouts_refuses_bad_input_with_exit_2():
    out = run("timeouts", env={"FTHSDP_FETCH_TIMEOUT_S": "later"})
    assert out.returncode == 2 and "FTHSDP_FETCH_TIMEOUT_S='later' is not a number of seconds" in out.stderr
    out = run("timeouts", "--settings", "/nonexistent/settings.json")
    assert out.returncode == 2 and "/nonexistent/settings.json" in out.stderr
    out = run("timeouts", "--fail-after-s", "0")
    assert out.returncode == 2 and "--fail-after-s: '0' is not a number of seconds above 0" in out.stderr


def test_the_demo_starts_every_process_so_it_checks_every_rule():
    from fthsdp.demo.run import RunSettings

    assert tr.check(RunSettings(replicas=4, ranks_per_replica=1, steps=100, seed=0, lr_policy="sqrt")
                    .timeout_values()) == []
    out = run("demo", "--heartbeat-timeout-s", "1.2", "--no-baseline")
    assert out.returncode == 2, out.stderr
    assert "controller.heartbeat_timeout_s (1.2 s) must be at least 3 × agent.heartbeat_interval_s (0.5 s)" \
        in out.stderr
