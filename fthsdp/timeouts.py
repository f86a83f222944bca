"""`fthsdp timeouts`: the effective timeouts of one configuration, checked against the rules.

    fthsdp timeouts [--settings FILE.json] [controller timeout flags] [agent timeout flags] [--json]

The controller's values come from its flags, then --settings (its JSON settings file), then
its defaults, as `fthsdp controller` reads them; the agent's from its flags, then its
defaults; the runtime's from the FTHSDP_* timeout variables of this environment (as
`RuntimeSettings.from_env` reads them; a keyword argument in the training script would win
over them), then its defaults. Prints them grouped by process, each with where it came from
and the wait it bounds, then every rule of protos/timeout_rules.py with its verdict.

Exit status: 0 when every rule holds, 1 when one is broken, 2 for bad input (a flag, the
settings file, a variable that is not a number of seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Mapping

from protos import cli_flags as flags
from protos import timeout_rules as tr

EXIT_BROKEN = 1
DEFAULT = "default"


def parser() -> argparse.ArgumentParser:
    from agent.main import add_timeout_flags as agent_flags
    from controller.main import add_timeout_flags as controller_flags

    p = argparse.ArgumentParser(prog="fthsdp timeouts", description=__doc__, allow_abbrev=False,  # sources by flag
                                formatter_class=flags.DefaultsFormatter)
    flags.add_version(p)
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.add_argument("--settings", metavar="FILE", type=flags.existing_file,
                   help="the controller's JSON settings file (fthsdp controller --settings; default: none)")
    controller_flags(p.add_argument_group("controller (fthsdp controller)"))
    agent_flags(p.add_argument_group("agent (fthsdp agent)"))
    return p


def _given(argv: list[str], p: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> the flag, for every option given on the command line."""
    used = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    return {action.dest: flag for action in p._actions for flag in action.option_strings if flag in used}


def collect(args: argparse.Namespace, given: Mapping[str, str],
            environ: Mapping[str, str]) -> dict[str, dict[str, tuple[float, str]]]:
    """process -> field -> (value, where it came from), from parsed flags (`given`: dest -> the
    flag, for those on the command line) and the environment. ValueError/OSError for bad input."""
    from agent.settings import AgentSettings
    from controller.settings import ControllerSettings
    from fthsdp.settings import TIMEOUT_ENV, RuntimeSettings, timeouts_from_env

    flags = {name: getattr(args, name) for name in ("join_timeout_s", "heartbeat_timeout_s", "fail_after_s",
                                                   "lease_ttl_s")}
    controller = ControllerSettings.merged(args.settings, **flags)
    in_file = json.loads(Path(args.settings).read_text()) if args.settings else {}
    agent = AgentSettings(controller_addresses=("-",), host_id="-", command=("-",),
                          connect_timeout_s=args.connect_timeout_s, heartbeat_interval_s=args.heartbeat_interval_s,
                          stop_grace_s=args.stop_grace_s, reserve_delay_s=args.reserve_delay_s,
                          telemetry_interval_s=args.telemetry_interval_s)
    from_env = timeouts_from_env(environ)
    runtime = RuntimeSettings(**from_env)

    def controller_source(name: str) -> str:
        outer, _, inner = name.partition(".")  # "diagnosis.hang_after_s" is nested in the file
        return given.get(name) or ("--settings" if (inner in in_file.get(outer, {}) if inner else name in in_file)
                                   else DEFAULT)

    return {
        tr.CONTROLLER: {n: (v, controller_source(n)) for n, v in controller.timeout_values().items()},
        tr.AGENT: {n: (v, given.get(n, DEFAULT)) for n, v in agent.timeout_values().items()},
        tr.RUNTIME: {n: (v, TIMEOUT_ENV[n] if n in from_env else DEFAULT) for n, v in runtime.timeout_values().items()},
    }


def verdicts(values: Mapping[str, float]) -> list[tuple[tr.Rule, tr.Violation | None]]:
    broken = {v.rule: v for v in tr.check(values)}
    return [(rule, broken.get(rule)) for rule in tr.RULES]


def render(found: dict[str, dict[str, tuple[float, str]]], judged: list[tuple[tr.Rule, tr.Violation | None]]) -> str:
    width = max(len(n) for fields in found.values() for n in fields)
    source_width = max(len(source) for fields in found.values() for _, source in fields.values())
    lines = []
    for process, fields in found.items():
        lines.append(process)
        for name, (value, source) in fields.items():
            lines.append(f"  {name:<{width}} {value:>8g} s  {source:<{source_width}} {tr.WAITS[f'{process}.{name}']}")
        lines.append("")
    lines.append("rules")
    for rule, violation in judged:
        verdict = "BROKEN" if violation else "ok"
        lines.append(f"  {verdict:<7}{rule.text()}")
        lines.append(f"         {violation.message() if violation else rule.why}")
    broken = sum(1 for _, v in judged if v)
    lines.append("")
    lines.append(f"{broken} of {len(judged)} rules broken" if broken else f"all {len(judged)} rules hold")
    return "\n".join(lines)


def as_json(found: dict[str, dict[str, tuple[float, str]]], judged: list[tuple[tr.Rule, tr.Violation | None]]) -> dict:
    return {
        "processes": {process: {name: {"value_s": value, "source": source, "bounds": tr.WAITS[f"{process}.{name}"]}
                                for name, (value, source) in fields.items()} for process, fields in found.items()},
        "rules": [{"rule": rule.text(), "larger": rule.larger, "smaller": list(rule.smaller), "factor": rule.factor,
                   "why": rule.why, "ok": violation is None, "message": violation.message() if violation else ""}
                  for rule, violation in judged],
        "broken": sum(1 for _, v in judged if v),
    }


def main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        found = collect(args, _given(argv, p), os.environ if environ is None else environ)
    except (ValueError, OSError) as exc:
        print(f"fthsdp timeouts: error: {exc}", file=sys.stderr)
        return 2
    judged = verdicts({f"{process}.{name}": value for process, fields in found.items()
                       for name, (value, _) in fields.items()})
    print(json.dumps(as_json(found, judged), indent=2) if args.json else render(found, judged))
    return EXIT_BROKEN if any(v for _, v in judged) else 0
