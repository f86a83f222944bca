"""The `fthsdp` command line: one entry point, each subcommand imported lazily.

Users install one distribution and get `fthsdp controller`, `fthsdp agent`,
`fthsdp status`, `fthsdp demo` and `fthsdp compare-checkpoints`. The services are imported only when their
subcommand runs, so a trainer that imports `fthsdp` pays nothing for them.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function taking argv, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "controller": ("controller.main", "main", "run the quorum and recovery controller"),
    "agent": ("agent.main", "main", "run the per-host trainer supervisor"),
    "status": ("fthsdp.status", "main", "print a controller's REST status as tables"),
    "demo": ("fthsdp.demo", "main", "train a small model on this machine with injected failures"),
    "compare-checkpoints": ("fthsdp.checkpoint_compare", "main",
                            "name the ranks whose shards differ between two checkpoints of one step"),
    "bench": ("bench.suite", "main", "measure this cluster: quorum, FTAR vs Gloo, catch-up, recovery, failover"),
}


def _usage() -> str:
    lines = ["usage: fthsdp SUBCOMMAND [options]", "", "subcommands:"]
    lines += [f"  {name:<20} {help_}" for name, (_, _, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run `fthsdp SUBCOMMAND --help` for its options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"fthsdp: unknown subcommand {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = SUBCOMMANDS[name]
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
