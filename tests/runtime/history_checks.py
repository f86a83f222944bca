"""Consistency checks over the cluster's recorded step history (the invariants in docs/architecture.md)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from tests.runtime.cluster import Records


def committed_steps(rec: Records) -> dict[int, list[dict]]:
    by_step: dict[int, list[dict]] = defaultdict(list)
    for row in rec.where(event="commit"):
        by_step[row["step"]].append(row)
    return dict(sorted(by_step.items()))


def check_bitwise_identical_after_every_commit(rec: Records) -> int:
    """Every process that committed step n holds the same parameters, optimizer state, ledger."""
    steps = committed_steps(rec)
    for step, rows in steps.items():
        digests = {(r["replica"], r["rank"], r["incarnation"]): r["digest"] for r in rows}
        assert len(set(digests.values())) == 1, f"step {step} committed with different states: {digests}"
    return len(steps)


def check_identical_within_each_commit(rec: Records) -> int:
    """Every process that committed step n in quorum q holds the same state (a rollback may
    commit step n again, into another state, in a later quorum)."""
    by_commit: dict[tuple[int, int], dict] = defaultdict(dict)
    for r in rec.where(event="commit"):
        by_commit[(r["quorum_id"], r["step"])][(r["replica"], r["rank"], r.get("incarnation", r.get("pid")))] = \
            r["digest"]
    for (quorum_id, step), digests in sorted(by_commit.items()):
        assert len(set(digests.values())) == 1, (f"step {step} of quorum {quorum_id} committed with different "
                                                 f"states: {digests}")
    return len(by_commit)


def check_exactly_once(rec: Records, replicas: int) -> Counter:
    """Each batch (replica, position) is in committed history once; no position is skipped;
    and the batch a step included is the batch that replica actually trained on."""
    trained: dict[tuple[str, int], list[int]] = defaultdict(list)  # (replica, step) -> positions trained
    for row in rec.rows:
        if row.get("event") in ("commit", "retry") and not row["behind"]:
            trained[(row["replica"], row["step"])].append(row["trained_position"])
    batches: Counter = Counter()
    for step, rows in committed_steps(rec).items():
        views = {(tuple(r["included"]), tuple((k, r["positions_before"].get(k, 0)) for k in r["included"]))
                 for r in rows}
        assert len(views) == 1, f"step {step} was committed with different contents: {views}"
        included, positions = next(iter(views))
        for replica, position in positions:
            batches[(replica, position)] += 1
            actually = trained[(replica, step)]
            assert position in actually, (f"step {step} included batch {position} of replica {replica}, "
                                          f"which trained {actually} at that step")
    twice = [b for b, n in batches.items() if n > 1]
    assert not twice, f"batches trained twice: {twice}"
    for r in map(str, range(replicas)):
        positions = sorted(p for (rep, p) in batches if rep == r)
        assert positions == list(range(len(positions))), f"replica {r} skipped batches: {positions}"
    return batches


def check_retries_left_state_untouched(rec: Records) -> int:
    """After a failed step a process's state is exactly what it was after its previous commit."""
    last: dict[tuple, str] = {}
    retries = 0
    for row in rec.rows:
        key = (row["replica"], row["rank"], row["incarnation"])
        if row.get("event") == "commit":
            last[key] = row["digest"]
        elif row.get("event") == "retry" and not row["behind"] and key in last:
            assert row["digest"] == last[key], f"{key} changed state in failed step {row['step']}"
            retries += 1
    return retries


def check_restarted_replica_caught_up(rec: Records, replica: str) -> dict:
    """The restarted incarnation's first commit was a catch-up, identical to the others."""
    rows = [r for r in rec.where(event="commit", replica=replica) if r["incarnation"] > 0]
    assert rows, f"restarted replica {replica} never committed"
    first = rows[0]
    assert first["behind"], f"restarted replica {replica} did not catch up first: {first}"
    others = [r for r in committed_steps(rec)[first["step"]] if r["replica"] != replica]
    assert others and all(o["digest"] == first["digest"] for o in others)
    return first


def survivor_waits_after_kill(rec: Records) -> list[float]:
    """For each kill, how long each surviving replica went without committing after it."""
    waits = []
    for kill in rec.where(event="killed"):
        for replica in {r["replica"] for r in rec.rows} - {kill["replica"]}:
            after = [r["t"] for r in rec.where(event="commit", replica=replica, rank=0) if r["t"] > kill["t"]]
            if after:
                waits.append(after[0] - kill["t"])
    return waits


def longest_fault_free_step_s(rec: Records) -> float:
    """The longest gap between consecutive commits of one process outside any fault window."""
    gaps = []
    for key in {(r["replica"], r["rank"], r["incarnation"]) for r in rec.rows}:
        times = [r["t"] for r in rec.rows if (r["replica"], r["rank"], r["incarnation"]) == key
                 and r.get("event") == "commit"]
        gaps += [b - a for a, b in zip(times, times[1:])]
    gaps.sort()
    return gaps[len(gaps) * 9 // 10] if gaps else 0.0


# ---------------------------------------------------------------- histories with rollbacks


@dataclass
class Commit:
    """One committed step of one history: every process that committed it, from its rows."""
    step: int
    digest: str                          # the state after the step
    before: str                          # the state it trained from ("" when only catch-ups recorded it)
    included: tuple[str, ...]
    ledger_before: dict[str, int]        # positions the step read (zeros dropped)
    rows: list[dict]

    @property
    def ledger_after(self) -> dict[str, int]:
        after = dict(self.ledger_before)
        for r in self.included:
            after[r] = after.get(r, 0) + 1
        return after

    @property
    def first_t(self) -> float:
        return min(r["t"] for r in self.rows)


@dataclass
class History:
    """The committed history the run ended with (step 0 to the last step, in order), and the
    commits of the branches it left behind (rolled back, or abandoned by a roll-forward)."""
    chain: list[Commit]
    abandoned: list[Commit]
    branches: int                        # how many abandoned branches there were


def _nonzero(positions: dict) -> dict[str, int]:
    return {k: int(v) for k, v in positions.items() if v}


def _commits(rows: list[dict]) -> list[Commit]:
    nodes: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for row in rows:
        if row.get("event") == "commit":
            nodes[(row["step"], row["digest"])].append(row)
    out = []
    for (step, digest), group in sorted(nodes.items()):
        views = {(tuple(r["included"]), tuple(sorted(_nonzero(r["positions_before"]).items()))) for r in group}
        assert len(views) == 1, f"step {step} was committed into one state from different contents: {views}"
        befores = {r["before"] for r in group if r.get("before") and not r["behind"]}
        assert len(befores) <= 1, f"step {step} was committed into one state from different states: {befores}"
        included, ledger = next(iter(views))
        out.append(Commit(step, digest, next(iter(befores), ""), included, dict(ledger), group))
    return out


def _parent(node: Commit, by_step: dict[int, list[Commit]]) -> Commit | None:
    """The commit of the previous step this one trained from: the same ledger, and the same
    state where a healthy committer recorded it; the latest such before it when ambiguous."""
    candidates = [c for c in by_step.get(node.step - 1, []) if c.ledger_after == node.ledger_before
                  and (not node.before or c.digest == node.before)]
    earlier = [c for c in candidates if c.first_t <= node.first_t] or candidates
    return max(earlier, key=lambda c: c.first_t, default=None)


def committed_history(rec: Records) -> History:
    """Walk back from the newest committed state to step 0. Raises AssertionError when the
    run ended on two different states, or a committed step trained from a state no commit
    (and no fresh start) produced."""
    commits = _commits(rec.rows)
    assert commits, "nothing was committed"
    by_step: dict[int, list[Commit]] = defaultdict(list)
    for c in commits:
        by_step[c.step].append(c)
    last = max(by_step)
    assert len(by_step[last]) == 1, f"the run ended on {len(by_step[last])} different states at step {last}"
    chain = [by_step[last][0]]
    while chain[-1].step > 0:
        node = chain[-1]
        parent = _parent(node, by_step)
        assert parent is not None, (f"step {node.step} (ledger {node.ledger_before}) trained from a state no commit "
                                    f"of step {node.step - 1} produced (they left ledgers "
                                    f"{[c.ledger_after for c in by_step.get(node.step - 1, [])]})")
        chain.append(parent)
    assert not chain[-1].ledger_before, f"step 0 read the ledger {chain[-1].ledger_before}, not a fresh one"
    chain.reverse()
    on_chain = {id(c) for c in chain}
    abandoned = [c for c in commits if id(c) not in on_chain]
    off = {id(c) for c in abandoned}
    roots = [c for c in abandoned if (p := _parent(c, by_step)) is None or id(p) not in off]
    return History(chain, abandoned, len(roots))


def check_exactly_once_along(history: History, rec: Records, replicas: list[str]) -> Counter:
    """Each batch (replica, position) is in the committed history once, none is skipped, and
    the batch a step included is one that replica trained at that step (rolled-back branches
    are not part of the history and count nothing)."""
    trained: dict[tuple[str, int], set[int]] = defaultdict(set)
    for row in rec.rows:
        if row.get("event") == "trained" or (row.get("event") in ("commit", "retry") and not row["behind"]):
            trained[(row["replica"], row["step"])].add(row.get("trained_position", row.get("position")))
    batches: Counter = Counter()
    for c in history.chain:
        for replica in c.included:
            position = c.ledger_before.get(replica, 0)
            batches[(replica, position)] += 1
            assert position in trained[(replica, c.step)], (
                f"step {c.step} included batch {position} of replica {replica}, which trained "
                f"{sorted(trained[(replica, c.step)])} at that step")
    twice = sorted(b for b, n in batches.items() if n > 1)
    assert not twice, f"batches trained twice along the committed history: {twice}"
    for r in replicas:
        positions = sorted(p for (rep, p) in batches if rep == r)
        assert positions == list(range(len(positions))), f"replica {r} skipped batches: {positions}"
    return batches
