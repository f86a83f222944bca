"""What every `fthsdp` command line checks the same way: ports, log levels, files that must
exist, `--version`, defaults shown in `--help`, deprecated spellings.

Shared by `fthsdp controller`, `fthsdp agent` and the runtime's commands (`fthsdp status`,
`demo`, `compare-checkpoints`), which otherwise import nothing of one another. Bad values are
argparse errors (exit status 2, the message names the flag and the value), never tracebacks.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

#: The levels `--log-level` takes (logging's names; any case is accepted).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MAX_PORT = 65535


def version() -> str:
    """The installed distribution's version ("unknown" when run from a bare checkout)."""
    try:
        return metadata.version("fthsdp")
    except metadata.PackageNotFoundError:
        return "unknown"


def port(text: str) -> int:
    """A TCP port 0..65535 (0: the system picks a free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is an integer 0..{MAX_PORT}, got {text!r}") from None
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"a port is an integer 0..{MAX_PORT}, got {value}")
    return value


def log_level(text: str) -> str:
    """A logging level name, upper-cased (argparse then checks it against LOG_LEVELS)."""
    return text.upper()


def existing_file(text: str) -> str:
    """A path to a file that exists (returned as given)."""
    if not Path(text).is_file():
        what = "is a directory, not a file" if Path(text).is_dir() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {what}")
    return text


def existing_path(text: str) -> str:
    """A path (file or directory) that exists (returned as given)."""
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    return text


def add_log_level(p: argparse.ArgumentParser, help_: str = "the text log on stderr") -> None:
    p.add_argument("--log-level", type=log_level, choices=LOG_LEVELS, default="INFO", metavar="LEVEL",
                   help=f"{help_}: one of {', '.join(LOG_LEVELS)}")


def add_version(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                   help="print the fthsdp version and exit")


class Deprecated(argparse.Action):
    """An older spelling of an option: stores into the new option's dest and warns on stderr
    once, naming the new spelling (`new` and its meaning given as `why`)."""

    def __init__(self, option_strings, dest, new: str, why: str = "", **kw) -> None:
        self.new, self.why = new, why
        kw.setdefault("help", f"deprecated: the older spelling of {new}{f' ({why})' if why else ''}")
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated: use {self.new}"
              f"{f' ({self.why})' if self.why else ''}", file=sys.stderr)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


class DefaultsFormatter(argparse.RawDescriptionHelpFormatter):
    """Help with every option's default: " (default: X)" is added to a help text that does not
    already say its default, for options whose default is a value (not None or False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default == argparse.SUPPRESS
                or not action.option_strings or isinstance(action, Deprecated)):
            return text
        shown = ",".join(str(d) for d in default) if isinstance(default, (list, tuple)) else default
        if isinstance(shown, dict):
            shown = ",".join(f"{k}={v}" for k, v in shown.items()) or "none"
        return f"{text} (default: {str(shown).replace('%', '%%') if shown != '' else 'empty'})"


def default_shown(p: argparse.ArgumentParser, action: argparse.Action) -> bool:
    """Whether `action`'s help, as `p` prints it, tells its default: a flag that takes no value,
    a required option, a positional argument and an older spelling have none to tell; every
    other option's help must say "default"."""
    if action.nargs == 0 or not action.option_strings or action.required or isinstance(action, Deprecated):
        return True
    formatter = p._get_formatter()
    return "default" in formatter._expand_help(action) if action.help else False
