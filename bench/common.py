"""What every benchmark shares: sizes, ports, the machine's load, a job secret per run, and the
JSON lines each prints (with the fields it declares).

Every `bench/*.py` that runs as `python -m bench.X --json` declares `FIELDS`, a mapping from
each field of its JSON line to its type (`float` accepts an integer too; `X | None` a null),
and its docstring lists them. `fields_problems` is the one check of a line against them: the
smoke tests (tests/bench/test_smoke.py) and `fthsdp bench` (bench/suite.py) both use it, so a
field renamed without its declaration fails a test.
"""

from __future__ import annotations

import json
import os
import types
import typing
from pathlib import Path

from protos import job_secret
from protos.local_ports import listen_port

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}


def parse_size(text: str) -> int:
    """Bytes of "16MiB", "1.5GiB", "4096B" or "4096"; ValueError naming `text` otherwise."""
    for unit, factor in UNITS.items():
        if text.endswith(unit):
            number = text[: -len(unit)]
            break
    else:
        number, factor = text, 1
    try:
        value = int(float(number) * factor)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (give bytes, or a number with KiB, MiB or GiB)") from None
    if value < 0:
        raise ValueError(f"not a size: {text!r} is negative")
    return value


def size_text(nbytes: int) -> str:
    """The shortest exact name of `nbytes` in the units parse_size reads (16777216 -> "16MiB")."""
    for unit in ("GiB", "MiB", "KiB"):
        if nbytes and nbytes % UNITS[unit] == 0:
            return f"{nbytes // UNITS[unit]}{unit}"
    return f"{nbytes}B"


def free_port() -> int:
    """A loopback port free now, for a process that cannot be started on port 0: from below the
    kernel's ephemeral range, where no port-0 bind takes it meanwhile (protos/local_ports.py)."""
    return listen_port()


def load() -> list[float]:
    """The machine's 1/5/15-minute load averages (what else ran during the measurement)."""
    return [round(x, 2) for x in os.getloadavg()]


def secret_file(directory: str | Path, text: str = "") -> Path:
    """A job secret (`text`, else one made for this run) written as a user makes one (`openssl
    rand -hex 32 > job-secret`), readable only by its owner: give it with --job-secret-file."""
    path = Path(directory) / "job-secret"
    path.write_text((text or job_secret.generate()) + "\n")
    path.chmod(0o600)
    return path


def print_line(row: dict, as_json: bool) -> None:
    """One result: a JSON line (--json), else `key value` pairs on one line."""
    print(json.dumps(row) if as_json else ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)


def fields_problems(row: dict, fields: dict[str, object]) -> list[str]:
    """What is wrong with `row` against a module's FIELDS: missing fields and values of another
    type, each named ([] when it matches)."""
    problems = []
    for name, kind in fields.items():
        if name not in row:
            problems.append(f"{name} is missing")
        elif not _is(row[name], kind):
            problems.append(f"{name} is {row[name]!r} ({type(row[name]).__name__}), not {_name(kind)}")
    return problems


def _is(value, kind) -> bool:
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return any(_is(value, k) for k in typing.get_args(kind))
    if kind is None or kind is type(None):
        return value is None
    origin = typing.get_origin(kind)
    if origin is not None:  # list[float], dict[str, int]: the container's type only
        return isinstance(value, origin)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _name(kind) -> str:
    return getattr(kind, "__name__", None) or str(kind)
