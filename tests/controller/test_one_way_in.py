"""One way in: the controller's state changes only through `ControllerCore.step`.

The service and the tests read the state through `ControllerView` (controller/core/view.py),
which has no verb that changes anything; they never reach the mutable `ControllerState` or its
components: no import or use of them, no reach into a private attribute that holds them
(`core._state`, `view._s`). Tests drive the core with commands (tests/controller/drive.py).
A few pure leaf structures are tested alone, built by their test (never the ones a core holds).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from controller.core.core import ControllerCore
from controller.core.view import ControllerView
from controller.settings import ControllerSettings

ROOT = Path(__file__).resolve().parents[2]
#: where the state must be reached only through step and views
SCANNED = ("tests", "controller/service", "bench", "fthsdp", "agent")
#: the mutable state and the components it combines: never named outside controller/core
HIDDEN = {"ControllerState", "HostRegistry", "ReplicaRegistry", "Rounds", "JobLifecycle", "DivergenceTracker",
          "Diagnostician", "Suspects"}
#: private attributes that hold the mutable state (the core's, the view's)
PRIVATE_HOLDERS = {"_state", "_s"}
#: pure leaf structures a test may build and exercise alone (their own unit tests): the event
#: ring, the goodput tracker, the pending-writes ledger
ALONE = {"EventJournal", "GoodputTracker", "PendingWrites"}
#: what the view offers besides properties: each only reads
VIEW_READERS = {
    "join_refusal", "silence", "live_replicas", "dead_replicas", "durable_checkpoint", "authenticate_agent",
    "is_superseded", "replica_endpoints", "replica_hosts", "encoded_host_shard", "pending_writes",
    "snapshot_section", "snapshot_replicas", "snapshot_journal", "snapshot_addresses", "snapshot_hosts",
    "snapshot_host_shards", "addresses_snapshot",
}


def reaches(path: Path) -> list[str]:
    """Where `path` names the hidden state or reaches into a private holder of it."""
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.ImportFrom) and node.module == "controller.core.state":
            what = f"from {node.module} import ..."
        elif isinstance(node, ast.ImportFrom):
            hidden = [a.name for a in node.names if a.name in HIDDEN]
            what = f"imports {hidden}" if hidden else None
        elif isinstance(node, ast.Name) and node.id in HIDDEN:
            what = node.id
        elif isinstance(node, ast.Attribute) and node.attr in HIDDEN:
            what = ast.unparse(node)
        elif (isinstance(node, ast.Attribute) and node.attr in PRIVATE_HOLDERS
              and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            what = ast.unparse(node)
        if what:
            found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{node.lineno}: {what}")
    return found


def test_nothing_outside_the_core_reaches_the_mutable_state():
    found = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != Path(__file__):
                found += reaches(path)
    assert not found, f"the controller's state reached past core.step and the view: {found}"


def test_the_view_only_reads():
    public = {name: value for name, value in vars(ControllerView).items() if not name.startswith("_")}
    methods = {name for name, value in public.items() if not isinstance(value, property)}
    assert methods == VIEW_READERS, ("a new view method: check that it only reads, then list it",
                                     methods ^ VIEW_READERS)
    for name in methods:
        source = inspect.getsource(getattr(ControllerView, name))
        assert " = " not in source.split('"""')[-1], f"ControllerView.{name} assigns: {source}"


def test_the_view_has_no_setter():
    view = ControllerCore(ControllerSettings()).view
    with pytest.raises(AttributeError):
        view.hosts = {}
    with pytest.raises(AttributeError):
        view.anything_new = 1  # __slots__: no attribute can be added either


def test_the_check_finds_a_reach_into_the_state(tmp_path):
    """The scan itself finds what it must (so the test above can fail)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from controller.core.state import ControllerState\n"
                     "from controller.core.journal import EventJournal\n"
                     "def f(core, view, server):\n"
                     "    core._state.drain('h0', 1.0)\n"
                     "    return view._s, self._state, ControllerState\n")
    found = [f.split(": ", 1)[1] for f in reaches(probe)]
    assert sorted(found) == sorted(["from controller.core.state import ...", "core._state", "view._s",
                                    "ControllerState"]), found
