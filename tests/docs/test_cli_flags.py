"""Every flag of every `fthsdp` subcommand is checked and explained (issue 39, finding 7).

The first test walks the parsers of `fthsdp.cli.SUBCOMMANDS`: a new option without help, or
whose help does not tell its default, fails it (so the rule keeps itself). The others run the
real CLI in a child process: bad ports and log levels are argparse errors (exit 2, the value
named, no traceback), `--version` works everywhere, and a reader that leaves early
(`fthsdp status | head -3`) ends the command quietly.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from fthsdp.cli import SUBCOMMANDS
from protos import cli_flags

CLI = [sys.executable, "-m", "fthsdp.cli"]
#: the least a subcommand needs to get past its required options
REQUIRED = {"agent": ["--controller", "127.0.0.1:1", "--host-id", "h", "--insecure"],
            "compare-checkpoints": [".", "."]}


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    return [(name, importlib.import_module(module).parser()) for name, (module, _, _) in SUBCOMMANDS.items()]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_every_option_has_help_that_tells_its_default():
    missing = []
    for name, p in _parsers():
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = "/".join(action.option_strings) or action.dest
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"fthsdp {name} {flag}: no help")
            elif not cli_flags.default_shown(p, action):
                missing.append(f"fthsdp {name} {flag}: its help does not tell its default")
    assert not missing, "\n".join(missing)


def test_no_description_is_cut_mid_sentence():
    for name, p in _parsers():
        assert p.description.rstrip().endswith("."), f"fthsdp {name} --help: {p.description[-80:]!r}"


def test_every_port_and_log_level_is_checked_by_argparse():
    for name, p in _parsers():
        for action in p._actions:
            if action.dest.endswith("port") and action.nargs != 0:
                assert action.type is cli_flags.port, f"fthsdp {name} {action.option_strings} is not a port type"
            if action.dest == "log_level":
                assert tuple(action.choices) == cli_flags.LOG_LEVELS, f"fthsdp {name} --log-level has no choices"


@pytest.mark.parametrize("args, words", [
    (["controller", "--grpc-port", "-1"], "argument --grpc-port: a port is an integer 0..65535, got -1"),
    (["controller", "--http-port", "70000"], "argument --http-port: a port is an integer 0..65535, got 70000"),
    (["controller", "--quorum-port", "x"], "argument --quorum-port: a port is an integer 0..65535, got 'x'"),
    (["controller", "--log-level", "LOUD"], "argument --log-level: invalid choice: 'LOUD'"),
    (["controller", "--settings", "/nonexistent/settings.json"], "'/nonexistent/settings.json' does not exist"),
    (["agent", *REQUIRED["agent"], "--coordinator-port", "65536", "--", "t"],
     "argument --coordinator-port: a port is an integer 0..65535, got 65536"),
    (["agent", *REQUIRED["agent"], "--log-level", "LOUD", "--", "t"], "argument --log-level: invalid choice: 'LOUD'"),
    (["agent", *REQUIRED["agent"], "--job-secret-file", "/nonexistent/secret", "--", "t"],
     "'/nonexistent/secret' does not exist"),
    (["status", "--token-file", "/nonexistent/token"], "'/nonexistent/token' does not exist"),
])
def test_bad_values_exit_2_naming_them_without_a_traceback(args, words):
    out = _run(*args)
    assert out.returncode == 2, out.stderr
    assert words in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_version_everywhere():
    want = cli_flags.version()
    assert want != "unknown"
    assert _run("--version").stdout.strip() == f"fthsdp {want}"
    for name in ("controller", "agent", "status"):
        out = _run(name, "--version")
        assert out.returncode == 0 and out.stdout.strip() == f"fthsdp {name} {want}", out


def test_the_agents_old_restart_budget_spelling_still_works_and_warns(capsys):
    from agent.main import parse

    s = parse([*REQUIRED["agent"], "--restart-budget", "0", "--restart-window-s", "60", "--", "t"])
    assert (s.restart_budget, s.restart_window_s) == (0, 60.0)
    err = capsys.readouterr().err
    assert "--restart-budget is deprecated: use --standby-restart-budget" in err
    assert "--restart-window-s is deprecated: use --standby-restart-window-s" in err
    s = parse([*REQUIRED["agent"], "--standby-restart-budget", "1", "--standby-restart-window-s", "9", "--", "t"])
    assert (s.restart_budget, s.restart_window_s) == (1, 9.0) and capsys.readouterr().err == ""


def test_a_reader_that_leaves_early_ends_the_command_quietly(controller_process):
    ctl = controller_process("--replicas", "2", "--job-id", "pipe")
    status = subprocess.Popen([*CLI, "status", "--url", ctl.http, "--events", "100"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    status.stdout.close()  # as `head` does once it has its lines: every write now breaks the pipe
    err = status.stderr.read().decode()
    assert status.wait(60) == 0, err
    assert "BrokenPipe" not in err and "Traceback" not in err, err
