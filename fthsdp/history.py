"""The committed history of a recorded run, and exactly-once along it (pure: rows in, verdicts out).

A run may commit one step more than once, into different states, and be right: after a
rollback the job resumes from a checkpoint and trains the steps after it again; a
roll-forward abandons the branch a few replicas were on. So the history is not "every
commit of step n": it is the chain walked back from the newest committed state to step 0,
each commit's parent being the commit of the step before that left the ledger it read (and
the state it trained from, where a healthy committer recorded that). Commits off the chain
belong to abandoned branches: counted, not a problem. Problems are sentences naming the step
and the ledgers: the run ended on two different states; a step trained from a state no commit
of the step before produced (a batch skipped or read again breaks the chain there); step 0
read a ledger that was not fresh; a batch twice, or skipped, or not the one its replica
trained.

    history, problems = walk(rows)
    batches, more = exactly_once_along(history, trained_positions(rows), replicas)

Rows are trainer JSON lines (fthsdp/demo/trainer.py) of processes that hold the same state:
one rank of each replica when the model is sharded (rank k's shards differ from rank j's).
- "commit": step, digest (the state after it), before (the state it trained from; "" when it
  caught up), behind, included (replicas), positions_before (the ledger it read), t;
- "trained" (step, position), and "commit"/"retry" not behind (step, position): the batch
  that replica computed at that step.
A semi-synchronous run's commit row also says "batches": H, the inner steps (one batch each) a
sync commits for every contributor, at positions_before[r] .. + H - 1; one "trained" row per
inner step names the sync (step) it trains for.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class Commit:
    """One committed state of one step: every process that committed it, from its rows."""
    step: int
    digest: str                          # the state after the step
    before: str                          # the state it trained from ("" when only catch-ups recorded it)
    included: tuple[str, ...]
    ledger_before: dict[str, int]        # positions the step read (zeros dropped)
    rows: tuple[dict, ...]
    batches: int = 1                     # per contributor: a semi-synchronous sync commits H

    @property
    def ledger_after(self) -> dict[str, int]:
        after = dict(self.ledger_before)
        for r in self.included:
            after[r] = after.get(r, 0) + self.batches
        return after

    @property
    def first_t(self) -> float:
        return min(r["t"] for r in self.rows)


@dataclass(frozen=True)
class History:
    """The committed history the run ended with (step 0 to the last step, in order), and the
    commits of the branches it left behind (rolled back, or abandoned by a roll-forward)."""
    chain: tuple[Commit, ...]
    abandoned: tuple[Commit, ...]
    branches: int                        # how many abandoned branches there were

    @property
    def abandoned_steps(self) -> list[int]:
        return sorted({c.step for c in self.abandoned})


def _nonzero(positions: dict) -> dict[str, int]:
    return {k: int(v) for k, v in positions.items() if v}


def commits(rows: list[dict]) -> tuple[list[Commit], list[str]]:
    """The committed states, one per (step, digest), in step order; and the problems of those
    whose committers disagree on what the step read or trained from."""
    nodes: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for row in rows:
        if row.get("event") == "commit":
            nodes[(row["step"], row["digest"])].append(row)
    out, problems = [], []
    for (step, digest), group in sorted(nodes.items()):
        views = {(tuple(r["included"]), tuple(sorted(_nonzero(r["positions_before"]).items())), r.get("batches", 1))
                 for r in group}
        befores = {r["before"] for r in group if r.get("before") and not r["behind"]}
        if len(views) != 1:
            problems.append(f"step {step} was committed into one state from different contents: {sorted(views)}")
        elif len(befores) > 1:
            problems.append(f"step {step} was committed into one state from different states: {sorted(befores)}")
        else:
            included, ledger, batches = next(iter(views))
            out.append(Commit(step, digest, next(iter(befores), ""), included, dict(ledger), tuple(group), batches))
    return out, problems


def _parent(node: Commit, by_step: dict[int, list[Commit]]) -> Commit | None:
    """The commit of the previous step this one trained from: the same ledger, and the same
    state where a healthy committer recorded it; the latest such before it when ambiguous."""
    candidates = [c for c in by_step.get(node.step - 1, []) if c.ledger_after == node.ledger_before
                  and (not node.before or c.digest == node.before)]
    earlier = [c for c in candidates if c.first_t <= node.first_t] or candidates
    return max(earlier, key=lambda c: c.first_t, default=None)


def walk(rows: list[dict]) -> tuple[History | None, list[str]]:
    """Walk back from the newest committed state to step 0: the history, or None and why not."""
    nodes, problems = commits(rows)
    if problems:
        return None, problems
    if not nodes:
        return None, ["no step was committed"]
    by_step: dict[int, list[Commit]] = defaultdict(list)
    for c in nodes:
        by_step[c.step].append(c)
    last = max(by_step)
    if len(by_step[last]) != 1:
        return None, [f"the run ended on {len(by_step[last])} different states at step {last}: "
                      f"{sorted(c.digest[:12] for c in by_step[last])}"]
    chain = [by_step[last][0]]
    while chain[-1].step > 0:
        node = chain[-1]
        parent = _parent(node, by_step)
        if parent is None:
            return None, [f"step {node.step} (ledger {node.ledger_before}) trained from a state no commit of step "
                          f"{node.step - 1} produced (they left ledgers "
                          f"{[c.ledger_after for c in by_step.get(node.step - 1, [])]})"]
        chain.append(parent)
    if chain[-1].ledger_before:
        return None, [f"step 0 read the ledger {chain[-1].ledger_before}, not a fresh one"]
    chain.reverse()
    on_chain = set(chain)
    abandoned = [c for c in nodes if c not in on_chain]
    off = set(abandoned)
    roots = [c for c in abandoned if (p := _parent(c, by_step)) is None or p not in off]
    return History(tuple(chain), tuple(abandoned), len(roots)), []


def trained_positions(rows: list[dict]) -> dict[tuple[str, int], set[int]]:
    """(replica, step) -> the positions of the batches that replica computed at that step."""
    trained: dict[tuple[str, int], set[int]] = defaultdict(set)
    for row in rows:
        if row.get("event") == "trained" or (row.get("event") in ("commit", "retry") and not row["behind"]
                                             and "position" in row):  # a sync's rows: its "trained" ones
            trained[(row["replica"], row["step"])].add(row["position"])
    return trained


def exactly_once_along(history: History, trained: dict[tuple[str, int], set[int]],
                       replicas: list[str]) -> tuple[Counter, list[str]]:
    """Each batch (replica, position) is in the committed history once, none is skipped, and
    the batch a step included is one that replica trained at that step (abandoned branches are
    not part of the history and count nothing). Returns the batches and the problems."""
    problems: list[str] = []
    batches: Counter = Counter()
    for c in history.chain:
        for replica in c.included:
            mine = sorted(trained.get((replica, c.step), ()))
            for position in range(c.ledger_before.get(replica, 0), c.ledger_before.get(replica, 0) + c.batches):
                batches[(replica, position)] += 1
                if position not in mine:
                    problems.append(f"step {c.step} included batch {position} of replica {replica}, which trained "
                                    f"{mine} at that step")
    problems += [f"batch {p} of replica {r} was trained {n} times along the committed history"
                 for (r, p), n in sorted(batches.items()) if n > 1]
    for replica in replicas:
        positions = {p for (r, p) in batches if r == replica}
        missing = sorted(set(range(max(positions, default=-1) + 1)) - positions)
        if missing:
            problems.append(f"replica {replica} skipped batches {missing[:10]}")
    return batches, problems
