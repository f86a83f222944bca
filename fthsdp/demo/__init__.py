"""`fthsdp demo`: train a small model with real replicas, agents and injected failures.

The package is split the house way: pure decisions (`schedule`, `report`, `data`) apart
from process orchestration (`procs`, `run`), the trainer process (`trainer`) and the
command line (`cli`). Importing this package imports neither torch nor matplotlib.
"""

from __future__ import annotations


def main(argv: list[str]) -> int:
    from fthsdp.demo.cli import main as _main

    return _main(argv)


def parser():
    from fthsdp.demo.cli import parser as _parser

    return _parser()


__all__ = ["main", "parser"]
