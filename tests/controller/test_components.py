"""The controller's components keep to their public surfaces.

The components (lifecycle, divergence, restart budget, diagnosis, hosts, replicas, rounds) own their
data; no module of the controller's core reads or writes another's `_private` attributes: a component
touches only its own (`self._x`), and the state that combines them (ControllerState) reaches a
component only through public names (`self.lifecycle.job_state`, never `self.lifecycle._x`).
The import-linter contracts (pyproject.toml) keep them from importing one another.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "controller" / "core"
#: component modules, and the attribute of ControllerState that holds each component
COMPONENTS = {"finishing.py": "lifecycle", "divergence.py": "divergence", "restarts.py": "restart_budget",
              "diagnosis/acting.py": "diagnostician", "hosts.py": "host_registry", "replicas.py": "replica_registry",
              "rounds.py": "rounds"}


def _private_reaches(path: Path, holders: set[str]) -> list[str]:
    """`x._name` where x is not `self`/`cls`, and `self.<holder>._name`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self":
            if owner.attr not in holders:
                continue  # the state's own records (self.writes, self.suspects, ...) are not components
        where = path.relative_to(CORE) if path.is_relative_to(CORE) else path.name
        found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_components_touch_only_their_own_private_attributes():
    found = []
    for name in COMPONENTS:
        found += [f for f in _private_reaches(CORE / name, set()) if not f.split(": ", 1)[1].startswith("self.")]
    assert not found, f"a component reaches into another object's private attributes: {found}"


def test_the_combining_state_reaches_components_only_through_public_names():
    holders = set(COMPONENTS.values())
    found = []
    for path in sorted(CORE.rglob("*.py")):
        found += [f for f in _private_reaches(path, holders) if ".".join(f.split(": ", 1)[1].split(".")[:2])
                  in {f"self.{h}" for h in holders}]
    assert not found, f"a component's private attribute used from outside it: {found}"


def test_the_check_finds_a_reach_into_a_component(tmp_path):
    """The check itself finds what it must (so the tests above can fail)."""
    probe = tmp_path / "probe.py"
    probe.write_text("class S:\n    def f(self, r):\n        return self.lifecycle._times, r._x, self._own\n")
    found = _private_reaches(probe, {"lifecycle"})
    assert [f.split(": ", 1)[1] for f in found] == ["self.lifecycle._times", "r._x"]
