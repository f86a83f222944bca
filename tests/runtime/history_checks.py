"""Consistency checks over the cluster's recorded step history (the invariants in docs/architecture.md)."""

from __future__ import annotations

from collections import Counter, defaultdict

from fthsdp import history
from fthsdp.history import History
from tests.runtime.cluster import Records


def committed_steps(rec: Records) -> dict[int, list[dict]]:
    by_step: dict[int, list[dict]] = defaultdict(list)
    for row in rec.where(event="commit"):
        by_step[row["step"]].append(row)
    return dict(sorted(by_step.items()))


def check_bitwise_identical_after_every_commit(rec: Records, sharded: bool = False) -> int:
    """Every process that committed step n holds the same parameters, optimizer state, ledger
    (`sharded`: rank k of every replica holds the same shard k)."""
    steps = committed_steps(rec)
    for step, rows in steps.items():
        for rank in sorted({r["rank"] for r in rows}) if sharded else [None]:
            digests = {(r["replica"], r["rank"], r["incarnation"]): r["digest"] for r in rows
                       if rank is None or r["rank"] == rank}
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


def check_restarted_replica_caught_up(rec: Records, replica: str, sharded: bool = False) -> dict:
    """The restarted incarnation's first commit was a catch-up, identical to the others
    (`sharded`: each rank to the same rank of the others); returns rank 0's row."""
    rows = [r for r in rec.where(event="commit", replica=replica) if r["incarnation"] > 0]
    assert rows, f"restarted replica {replica} never committed"
    first = rows[0]
    assert first["behind"], f"restarted replica {replica} did not catch up first: {first}"
    for mine in [r for r in rows if r["step"] == first["step"]]:
        others = [r for r in committed_steps(rec)[first["step"]]
                  if r["replica"] != replica and (not sharded or r["rank"] == mine["rank"])]
        assert others and all(o["digest"] == mine["digest"] for o in others), (mine, others)
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
# The walk is fthsdp/history.py (the demo's report uses it too); these assert what it finds.


def committed_history(rec: Records) -> History:
    """Walk back from the newest committed state to step 0. Raises AssertionError when the
    run ended on two different states, or a committed step trained from a state no commit
    (and no fresh start) produced."""
    walked, problems = history.walk(rec.rows)
    assert walked is not None, "; ".join(problems)
    return walked


def check_exactly_once_along(walked: History, rec: Records, replicas: list[str]) -> Counter:
    """Each batch (replica, position) is in the committed history once, none is skipped, and
    the batch a step included is one that replica trained at that step (rolled-back branches
    are not part of the history and count nothing)."""
    batches, problems = history.exactly_once_along(walked, history.trained_positions(rec.rows), replicas)
    assert not problems, "; ".join(problems)
    return batches


def check_included_samples(walked: History, rec: Records, expected) -> int:
    """Every batch the committed history included held the samples `expected(replica, position)`
    names, in every attempt that replica trained at that step (rows with "samples": the ids of the
    batch the step computed). Returns how many included batches were checked."""
    trained: dict[tuple[str, int], list[list[int]]] = defaultdict(list)
    for row in rec.rows:
        if row.get("event") in ("commit", "retry") and not row["behind"]:
            trained[(row["replica"], row["step"])].append(row["samples"])
    checked = 0
    for commit in walked.chain:
        for replica in commit.included:
            position = commit.ledger_before.get(replica, 0)
            want, got = expected(replica, position), trained[(replica, commit.step)]
            assert got and all(s == want for s in got), (f"step {commit.step} included batch {position} of replica "
                                                         f"{replica}: it held {got}, not {want}")
            checked += 1
    return checked


def check_loader_served_ledger_positions(rec: Records, dataset_len: int, batch_size: int, replicas: int,
                                         loader_workers: int) -> int:
    """Every step (inner step) trained the batch its ledger position names in its replica's
    shuffled order (fthsdp.data.ShuffledOrder, seed 0), read by one of the DataLoader's worker
    processes, not by the trainer itself: after a kill, a restart and a catch-up the loader
    dropped what it had prefetched and served the ledger's position. Returns the rows checked."""
    from fthsdp.data import ReplicaShard, ShuffledOrder  # torch: only for the runs that used a DataLoader

    orders = {str(r): ShuffledOrder(dataset_len, batch_size, ReplicaShard.of(str(r), replicas))
              for r in range(replicas)}
    trained = rec.where(event="trained")
    for row in trained:
        want = orders[row["replica"]].indices(row["position"])
        assert row["samples"] == want, (f"replica {row['replica']} trained {row['samples']} at position "
                                        f"{row['position']}, not {want}")
        assert row["workers"] and set(row["workers"]) <= set(range(loader_workers)), row
    return len(trained)
