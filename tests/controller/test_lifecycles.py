"""Each lifecycle (host, replica, job) is drawn once, in its state enum's docstring
(controller/core/model.py), and the drawing is the transition table the code checks.

Three checks: the drawing's edges are exactly the table; every assignment of a record's state
in controller/ happens where the move is checked against its table; and random command
sequences through `ControllerCore.step` move replicas and the job only along their tables.
"""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path

import pytest

from controller.core import commands as c
from controller.core.core import ControllerCore
from controller.core.errors import RequestError
from controller.core.model import (
    HOST_MOVES, JOB_MOVES, REPLICA_MOVES, Host, HostState, IllegalMove, JobState, JoinRequest, ReplicaState,
    check_move, move_host,
)
from controller.settings import ControllerSettings

CONTROLLER = Path(__file__).resolve().parents[2] / "controller"
LIFECYCLES = [(ReplicaState, REPLICA_MOVES), (HostState, HOST_MOVES), (JobState, JOB_MOVES)]
#: `A / B ──(why, which may hold (parentheses))──▶ C / D`
EDGE = re.compile(r"^\s*(?P<sources>[A-Z /]+?)\s*──\((?P<why>[^)]*(?:\([^)]*\)[^)]*)*)\)──▶"
                  r"\s*(?P<targets>[A-Z /]+?)\s*$")


def drawn_moves(enum) -> frozenset:
    """The edges the docstring draws: every `A / B ──(why)──▶ C / D` line (each name must be a
    state of `enum`; staying in a state is no move)."""
    names = {s.name: s for s in enum}
    edges = set()
    for line in enum.__doc__.splitlines():
        if "──▶" not in line:
            continue
        m = EDGE.match(line)
        assert m is not None, f"{enum.__name__}: an arrow line that is not an edge: {line!r}"
        assert m["why"].strip(), f"{enum.__name__}: an edge without its reason: {line!r}"
        sources, targets = ([names[n.strip()] for n in m[side].split("/")] for side in ("sources", "targets"))
        edges |= {(a, b) for a in sources for b in targets if a != b}
    return frozenset(edges)


@pytest.mark.parametrize("enum, table", LIFECYCLES, ids=[e.__name__ for e, _ in LIFECYCLES])
def test_the_drawing_is_the_table(enum, table):
    drawn = drawn_moves(enum)
    assert drawn == table, (f"{enum.__name__}: drawn but not in the table {sorted(drawn - table)}; "
                            f"in the table but not drawn {sorted(table - drawn)}")
    assert {s for edge in table for s in edge} == set(enum), f"{enum.__name__}: a state no move reaches or leaves"


class _Drawn:
    """ReplicaState's names under another docstring (to check the parser itself)."""

    __name__ = "Drawn"

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc

    def __iter__(self):
        return iter(ReplicaState)


def test_the_parser_refuses_a_wrong_drawing():
    assert drawn_moves(_Drawn("    JOINING / DEAD ──(x (y))──▶ HEALTHY / DEAD\n")) == {
        (ReplicaState.JOINING, ReplicaState.HEALTHY), (ReplicaState.JOINING, ReplicaState.DEAD),
        (ReplicaState.DEAD, ReplicaState.HEALTHY)}
    with pytest.raises(AssertionError, match="without its reason"):
        drawn_moves(_Drawn("    JOINING ──()──▶ HEALTHY\n"))
    with pytest.raises(AssertionError, match="not an edge"):
        drawn_moves(_Drawn("    JOINING ──▶ HEALTHY\n"))
    with pytest.raises(KeyError, match="SLEEPING"):
        drawn_moves(_Drawn("    JOINING ──(x)──▶ SLEEPING\n"))


def test_a_move_outside_its_table_raises():
    assert (ReplicaState.FINISHED, ReplicaState.DEAD) not in REPLICA_MOVES
    with pytest.raises(IllegalMove, match="replica r0 may not move from FINISHED to DEAD"):
        check_move(REPLICA_MOVES, "replica r0", ReplicaState.FINISHED, ReplicaState.DEAD)
    with pytest.raises(IllegalMove, match="job j may not move from FAILED to COMPLETED"):
        check_move(JOB_MOVES, "job j", JobState.FAILED, JobState.COMPLETED)
    check_move(JOB_MOVES, "job j", JobState.FAILED, JobState.FAILED)  # staying is no move
    h = Host("h0", "i1", HostState.SPARE)
    move_host(h, HostState.ACTIVE)
    assert h.state == HostState.ACTIVE


# -- the code changes a state only where the move is checked ------------------------------------

#: the attributes that hold a lifecycle's state: a replica's or a host's `state`, the job's
#: `completed_at` / `failed_at`
STATE_ATTRIBUTES = {"state", "completed_at", "failed_at"}
#: where a state may be set without a move: a record made or loaded, not moved
NOT_A_MOVE = {"__init__", "restore"}


def _assigned_attributes(fn: ast.AST) -> set[str]:
    """The STATE_ATTRIBUTES that `fn` assigns (`self.state` is the core's state object, not a
    record's state)."""
    out = set()
    for node in ast.walk(fn):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            for leaf in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(leaf, ast.Attribute) and leaf.attr in STATE_ATTRIBUTES and not (
                        leaf.attr == "state" and isinstance(leaf.value, ast.Name) and leaf.value.id == "self"):
                    out.add(leaf.attr)
    return out


def _calls(fn: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == name
               for n in ast.walk(fn))


def test_every_state_change_in_the_controller_is_a_checked_move():
    setters = []
    for path in sorted(CONTROLLER.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name not in NOT_A_MOVE:
                if _assigned_attributes(fn):
                    setters.append((path.relative_to(CONTROLLER).as_posix(), fn.name, _calls(fn, "check_move")))
    unchecked = [(f, name) for f, name, checked in setters if not checked]
    assert not unchecked, f"a record's state is set without check_move: {unchecked}"
    # the places that move a lifecycle (a rename here is fine: keep the list true)
    assert {(f, name) for f, name, _ in setters} == {
        ("core/model.py", "move_host"), ("core/replicas.py", "transition"),
        ("core/finishing.py", "check_progress"), ("core/finishing.py", "replica_settled")}


# -- random commands through the core move records only along their tables -----------------------

SETTINGS = ControllerSettings(replicas=3, min_replicas=2, join_timeout_s=2.0, heartbeat_timeout_s=10.0,
                              fail_after_s=5.0, digest_wait_s=1.0)
BECAME = re.compile(r"^replica (\S+) became ([A-Z]+): ")
DIGESTS = ("a" * 64, "b" * 64)


def _command(rng: random.Random, core: ControllerCore, incarnations: dict[str, int]):
    state = core.view
    rid = rng.choice(sorted(incarnations))
    r = state.replicas.get(rid)
    kind = rng.choice(("join", "join", "close", "commit", "commit", "failed", "dead", "finish", "beat", "tick",
                       "restart"))
    if kind == "restart":
        incarnations[rid] += 1
    if kind in ("join", "restart"):
        step = r.committed_step + 1 if r is not None else 0
        if rng.random() < 0.2:
            step = max(step - 1, 0) if rng.random() < 0.5 else step + 1
        return c.Join(JoinRequest(rid, step, 1, incarnation=f"{rid}-{incarnations[rid]}"))
    if r is None or kind == "close":
        return c.CloseRound()
    if kind == "commit":
        return c.ReportStep(rid, r.given_step, r.given_quorum_id, digest=rng.choice(DIGESTS),
                            caught_up=rng.random() < 0.5)
    if kind == "failed":
        return c.ReportCommitFailed(rid, r.given_step, "no", r.given_quorum_id)
    if kind == "dead":
        return c.ReportReplicaDead(rid, "test")
    if kind == "finish":
        return c.ReportFinished(rid, max(r.committed_step, -1)) if rng.random() < 0.1 else c.CloseRound()
    if kind == "beat":
        return c.Heartbeat(replica_ids=tuple(rng.sample(sorted(incarnations), 2)))
    return c.Tick()


@pytest.mark.parametrize("seed", range(12))
def test_random_commands_move_replicas_and_the_job_only_along_their_tables(seed):
    rng = random.Random(seed)
    core = ControllerCore(SETTINGS)
    incarnations = {f"r{k}": 0 for k in range(3)}
    states: dict[str, ReplicaState] = {}
    seen = set()
    now = 0.0
    for _ in range(400):
        now += rng.choice((0.1, 0.5, 3.0, 11.0)) if rng.random() < 0.3 else 0.0
        job_before = core.view.job_state
        try:
            ready = core.step(_command(rng, core, incarnations), now)
        except RequestError:
            continue
        for e in ready.events:
            m = BECAME.match(e.message)
            if m is None:
                continue
            rid, new = m[1], ReplicaState(m[2])
            old = states.get(rid, ReplicaState.JOINING)
            assert (old, new) in REPLICA_MOVES, f"seed {seed}: replica {rid} moved {old.name} → {new.name}"
            seen.add((old, new))
            states[rid] = new
        assert core.view.job_state in (job_before,) or (job_before, core.view.job_state) in JOB_MOVES
        for rid, r in core.view.replicas.items():
            assert r.state == states.get(rid, ReplicaState.JOINING), f"seed {seed}: {rid} moved without its event"
    # the walk moved replicas several ways (it could not pass by moving nobody)
    assert len(seen) >= 3, f"seed {seed}: replicas moved only {sorted(seen)}"


def test_a_replica_left_out_of_a_quorum_moves_back_to_joining():
    """The move the random walk rarely makes: a quorum forms at the join timeout without r2."""
    core = ControllerCore(SETTINGS)
    for rid in ("r0", "r1", "r2"):
        core.step(c.Join(JoinRequest(rid, 0, 1, incarnation=rid)), 0.0)
    assert core.step(c.CloseRound(), 0.0).quorum is not None
    for rid in ("r0", "r1", "r2"):
        core.step(c.ReportStep(rid, 0, core.view.replicas[rid].given_quorum_id), 0.5)
    for rid in ("r0", "r1"):
        core.step(c.Join(JoinRequest(rid, 1, 1, incarnation=rid)), 1.0)
    assert core.step(c.CloseRound(), 1.0).quorum is None  # r2 is live: the round waits for it
    ready = core.step(c.CloseRound(), 1.0 + SETTINGS.join_timeout_s)
    assert ready.quorum is not None and ready.quorum.member_ids == {"r0", "r1"}
    r2 = core.view.replicas["r2"]
    assert r2.state == ReplicaState.JOINING and r2.reason.startswith("left out of quorum")
    assert (ReplicaState.HEALTHY, ReplicaState.JOINING) in REPLICA_MOVES


def test_the_last_replica_row_is_real_a_dead_replica_healed_by_a_late_caught_up_commit():
    """DEAD ──(a late caught-up commit of one that must re-sync)──▶ HEALTHY: drawn because the
    code makes it (kept as it is; a fix would drop the row and this test)."""
    a, b = "a" * 64, "b" * 64
    core = ControllerCore(SETTINGS)
    for rid in ("r0", "r1", "r2"):
        core.step(c.Join(JoinRequest(rid, 0, 1, incarnation=rid)), 0.0)
    core.step(c.CloseRound(), 0.0)
    for rid, digest in (("r0", a), ("r1", a), ("r2", b)):
        core.step(c.ReportStep(rid, 0, core.view.replicas[rid].given_quorum_id, digest=digest), 0.5)
    for rid in ("r0", "r1", "r2"):
        core.step(c.Join(JoinRequest(rid, 1, 1, incarnation=rid)), 1.0)
    core.step(c.CloseRound(), 1.0)
    r2 = core.view.replicas["r2"]
    assert r2.state == ReplicaState.DIVERGED
    core.step(c.ReportReplicaDead("r2", "reported"), 1.1)
    assert r2.state == ReplicaState.DEAD
    core.step(c.ReportStep("r2", r2.given_step, r2.given_quorum_id, digest=a, caught_up=True), 1.2)
    assert r2.state == ReplicaState.HEALTHY and r2.reason.startswith("re-synced from r0, r1")
