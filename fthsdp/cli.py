"""The `fthsdp` command line: one entry point, each subcommand imported lazily.

Users install one distribution and get `fthsdp controller`, `fthsdp agent`,
`fthsdp status`, `fthsdp demo`, `fthsdp compare-checkpoints` and `fthsdp timeouts`. The services are imported only when their
subcommand runs, so a trainer that imports `fthsdp` pays nothing for them.
"""

from __future__ import annotations

import importlib
import os
import sys

from protos import cli_flags

# subcommand -> (module, function taking argv, one-line help); each module also has `parser()`,
# its argparse parser (tests/docs/test_cli_flags.py walks them all)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "controller": ("controller.main", "main", "run the quorum and recovery controller"),
    "agent": ("agent.main", "main", "run the per-host trainer supervisor"),
    "status": ("fthsdp.status", "main", "print a controller's REST status as tables"),
    "demo": ("fthsdp.demo", "main", "train a small model on this machine with injected failures"),
    "compare-checkpoints": ("fthsdp.checkpoint_compare", "main",
                            "name the ranks whose shards differ between two checkpoints of one step"),
    "timeouts": ("fthsdp.timeouts", "main",
                 "print a configuration's timeouts by process and check them against the rules"),
    "bench": ("bench.suite", "main", "measure this cluster: quorum, FTAR vs Gloo, catch-up, recovery, failover"),
}


def _usage() -> str:
    lines = ["usage: fthsdp SUBCOMMAND [options]", "", "subcommands:"]
    lines += [f"  {name:<20} {help_}" for name, (_, _, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run `fthsdp SUBCOMMAND --help` for its options, `fthsdp --version` for the version."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"fthsdp {cli_flags.version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"fthsdp: unknown subcommand {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = SUBCOMMANDS[name]
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(func(rest) or 0)
    except BrokenPipeError:
        return _reader_left()


def _reader_left() -> int:
    """Whoever read our output stopped (`fthsdp status | head -3`): end quietly, as a pipe's
    writer does. stdout goes to /dev/null so that the interpreter's last flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


if __name__ == "__main__":
    sys.exit(main())
