"""Consistency checks over the cluster's recorded step history (the invariants in docs/architecture.md)."""

from __future__ import annotations

from collections import Counter, defaultdict

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
