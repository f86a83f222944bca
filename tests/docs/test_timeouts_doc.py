"""docs/operations.md "Timeouts" draws the hierarchy of protos/timeout_rules.py: every timeout
with its real default, every rule in the table and in the picture, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from fthsdp.timeouts import parser, collect
from protos import timeout_rules as tr

ROOT = Path(__file__).resolve().parents[2]


def section() -> str:
    text = (ROOT / "docs/operations.md").read_text()
    return text[text.index("## Timeouts"):text.index("## Who may call what")]


def node(name: str) -> str:
    return name.replace(".", "_")


def test_every_timeout_is_a_row_with_its_default():
    rows = {m.group(1, 2): float(m.group(3)) for m in re.finditer(
        r"^\| (controller|agent|runtime) \| `([\w.]+)` \| ([\d.]+) s \|", section(), re.M)}
    found = collect(parser().parse_args([]), {}, {})
    defaults = {(process, name): value for process, fields in found.items() for name, (value, _) in fields.items()}
    assert rows == defaults


def test_every_rule_is_in_the_table_once_with_who_checks_it():
    rows = dict(re.findall(r"^\| `([^`]+)` \| (controller|agent|runtime|`fthsdp timeouts`) \|", section(), re.M))
    expected = {}
    for rule in tr.RULES:
        (process, *others) = rule.processes
        expected[rule.text()] = process if not others else "`fthsdp timeouts`"
    assert rows == expected


def test_the_picture_draws_every_rule_and_nothing_else():
    block = re.search(r"```mermaid\n(.*?)```", section(), re.S).group(1)
    edges = set(re.findall(r"^\s*(\w+) -->(?:\|([^|]*)\|)? (\w+)$", block, re.M))
    expected = set()
    for rule in tr.RULES:
        label = "+" if len(rule.smaller) > 1 else ("" if rule.factor == 1 else f"{rule.factor:g}×")
        expected |= {(node(rule.larger), label, node(small)) for small in rule.smaller}
    assert edges == expected
    found = collect(parser().parse_args([]), {}, {})
    for name in {n for rule in tr.RULES for n in rule.names}:
        process, field = name.split(".", 1)
        label = f'{node(name)}["{field} {found[process][field][0]:g} s"]'
        assert re.search(rf"^\s*{re.escape(label)}$", block, re.M), label
