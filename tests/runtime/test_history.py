"""The committed-history walk over synthetic trainer rows (pure): a rollback or an abandoned
branch is counted, not a problem; a skipped or repeated batch, a step trained from a state no
commit produced, two final states, a batch its replica never trained: each found and named."""

from __future__ import annotations

import pytest

from fthsdp import history
from fthsdp.history import Commit, History

R = ["a", "b"]


class Run:
    """Trainer rows of replicas `a` and `b` committing steps; `ledger` is what the next step reads."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.ledger: dict[str, int] = {}
        self.state = ""  # the state the next step trains from ("" before step 0)
        self.t = 0.0

    def step(self, n: int, digest: str, included=("a", "b"), committers=("a", "b"), read=None) -> Run:
        """Step `n` includes `included` (each trains its batch at the ledger, or at `read`)."""
        read = {**self.ledger, **(read or {})}
        self.t += 1.0
        for rid in included:
            self.rows.append({"event": "trained", "replica": rid, "rank": 0, "step": n, "position": read.get(rid, 0),
                              "t": self.t})
        for rid in committers:
            self.rows.append({"event": "commit", "replica": rid, "rank": 0, "step": n, "t": self.t + 0.5,
                              "behind": False, "included": list(included), "positions_before": dict(read),
                              "position": read.get(rid, 0), "before": self.state, "digest": digest})
        self.ledger = {**read, **{rid: read.get(rid, 0) + 1 for rid in included}}
        self.state = digest
        return self

    def steps(self, first: int, last: int, prefix: str = "s") -> Run:
        for n in range(first, last + 1):
            self.step(n, f"{prefix}{n}")
        return self

    def back_to(self, ledger: dict[str, int], state: str) -> Run:
        """A rollback: the next steps train from an earlier committed state (a checkpoint)."""
        self.ledger, self.state = dict(ledger), state
        return self


def checked(run: Run) -> tuple[History | None, list[str]]:
    walked, problems = history.walk(run.rows)
    if walked is None:
        return None, problems
    return walked, history.exactly_once_along(walked, history.trained_positions(run.rows), R)[1]


def test_a_clean_run_is_one_chain_with_every_batch_once():
    walked, problems = checked(Run().steps(0, 5))
    assert problems == []
    assert [c.digest for c in walked.chain] == [f"s{n}" for n in range(6)]
    assert walked.abandoned == () and walked.branches == 0
    batches, _ = history.exactly_once_along(walked, history.trained_positions(Run().steps(0, 5).rows), R)
    assert sorted(batches) == [(r, p) for r in R for p in range(6)] and set(batches.values()) == {1}


def test_a_rollback_retraining_steps_4_and_5_is_not_a_problem_and_its_commits_are_counted():
    run = Run().steps(0, 5)
    run.back_to({"a": 4, "b": 4}, "s3").steps(4, 7, prefix="r")  # resumed from step 3's checkpoint
    walked, problems = checked(run)
    assert problems == []
    assert [c.digest for c in walked.chain] == ["s0", "s1", "s2", "s3", "r4", "r5", "r6", "r7"]
    assert sorted(c.digest for c in walked.abandoned) == ["s4", "s5"]
    assert walked.branches == 1 and walked.abandoned_steps == [4, 5]


def test_a_roll_forward_abandoning_one_replicas_step_is_one_branch():
    run = Run().steps(0, 3)
    run.step(4, "lone4", included=("b",), committers=("b",))  # b alone, then the job went on without it
    run.back_to({"a": 4, "b": 4}, "s3").steps(4, 6)
    walked, problems = checked(run)
    assert problems == [] and [c.digest for c in walked.abandoned] == ["lone4"] and walked.branches == 1


def test_a_catching_up_commit_joins_the_state_its_source_committed():
    run = Run().steps(0, 3)
    caught = dict(next(r for r in run.rows if r["event"] == "commit" and r["step"] == 3), replica="c", behind=True,
                  before="")
    run.rows.append(caught)
    walked, problems = checked(run)
    assert problems == [] and len(walked.chain[3].rows) == 3 and walked.abandoned == ()


@pytest.mark.parametrize("read, what", [({"a": 4}, "again"), ({"a": 6}, "skipping one")])
def test_a_batch_read_again_or_skipped_on_the_chain_breaks_it_there(read, what):
    run = Run().steps(0, 4)
    run.step(5, "s5", read=read).steps(6, 7)  # step 4 left a at 5: step 5 reads batch 4 again, or skips 5
    walked, [problem] = checked(run)
    assert walked is None, what
    assert problem == (f"step 5 (ledger {{'a': {read['a']}, 'b': 5}}) trained from a state no commit of step 4 "
                       f"produced (they left ledgers [{{'a': 5, 'b': 5}}])")


def test_a_step_trained_from_a_state_no_commit_produced_is_found():
    run = Run().steps(0, 3)
    run.state = "nobody's"  # the right ledger, but not step 3's state
    run.steps(4, 5)
    walked, [problem] = checked(run)
    assert walked is None and problem.startswith("step 4 (ledger {'a': 4, 'b': 4}) trained from a state no commit "
                                                 "of step 3 produced")


def test_two_final_states_are_a_divergence():
    run = Run().steps(0, 3)
    for row in run.rows:
        if row["event"] == "commit" and row["step"] == 3 and row["replica"] == "b":
            row["digest"] = "other3"
    walked, [problem] = checked(run)
    assert walked is None and problem == "the run ended on 2 different states at step 3: ['other3', 's3']"


def test_committers_of_one_state_that_disagree_on_its_contents_are_found():
    run = Run().steps(0, 3)
    next(r for r in run.rows if r["event"] == "commit" and r["step"] == 2 and r["replica"] == "b")["included"] = ["b"]
    walked, [problem] = checked(run)
    assert walked is None and problem.startswith("step 2 was committed into one state from different contents")


def test_step_0_must_read_a_fresh_ledger():
    run = Run()
    run.ledger = {"a": 3}
    walked, [problem] = checked(run.steps(0, 1))
    assert walked is None and problem == "step 0 read the ledger {'a': 3}, not a fresh one"


def test_nothing_committed_is_a_problem():
    assert history.walk([{"event": "trained", "replica": "a", "step": 0, "position": 0}]) == \
        (None, ["no step was committed"])


def test_a_batch_its_replica_never_trained_at_that_step_is_found():
    run = Run().steps(0, 3)
    run.rows = [r for r in run.rows if not (r["replica"] == "b" and r["step"] == 2 and r["event"] == "trained")]
    for r in run.rows:
        if r["replica"] == "b" and r["step"] == 2:
            r["position"] = 7
    walked, problems = checked(run)
    assert walked is not None and problems == ["step 2 included batch 2 of replica b, which trained [7] at that step"]


def test_a_batch_twice_or_skipped_along_a_chain_is_found():
    """Along a walked chain the ledgers link, so this is the last line of defence: on a chain
    whose step 1 included `a` twice and whose step 2 read a's batch 3, batch 1 counts twice
    and batch 2 is skipped."""
    def commit(step: int, included: tuple, ledger: dict) -> Commit:
        return Commit(step, f"s{step}", "", included, ledger, ({"t": float(step)},))
    chain = (commit(0, ("a", "b"), {}), commit(1, ("a", "a", "b"), {"a": 1, "b": 1}),
             commit(2, ("a", "b"), {"a": 3, "b": 2}))
    trained = {(r, s): {0, 1, 2, 3} for r in R for s in range(3)}
    batches, problems = history.exactly_once_along(History(chain, (), 0), trained, R)
    assert batches[("a", 1)] == 2 and batches[("b", 2)] == 1
    assert problems == ["batch 1 of replica a was trained 2 times along the committed history",
                        "replica a skipped batches [2]"]


def _sync_rows(n: int, before: str, digest: str, read: dict[str, int], h: int, trained: dict[str, range]) -> list[dict]:
    rows = [{"event": "trained", "replica": r, "rank": 0, "step": n, "position": p, "t": n}
            for r, positions in trained.items() for p in positions]
    return rows + [{"event": "commit", "replica": r, "rank": 0, "step": n, "t": n + 0.5, "behind": False,
                    "included": ["a", "b"], "positions_before": dict(read), "batches": h, "before": before,
                    "digest": digest} for r in ("a", "b")]


def test_a_semi_synchronous_sync_commits_h_batches_of_each_contributor():
    h = 3
    rows = _sync_rows(0, "", "s0", {}, h, {"a": range(0, 3), "b": range(0, 3)})
    rows += _sync_rows(1, "s0", "s1", {"a": 3, "b": 3}, h, {"a": range(3, 6), "b": range(3, 6)})
    walked, problems = history.walk(rows)
    assert problems == [] and walked.chain[-1].ledger_after == {"a": 6, "b": 6}
    batches, problems = history.exactly_once_along(walked, history.trained_positions(rows), R)
    assert problems == [] and sorted(batches) == [(r, p) for r in R for p in range(6)]
    # a contributor that trained only two of its three inner-step batches for sync 1
    short = [r for r in rows if not (r["event"] == "trained" and r["replica"] == "b" and r["position"] == 5)]
    _, problems = history.exactly_once_along(walked, history.trained_positions(short), R)
    assert problems == ["step 1 included batch 5 of replica b, which trained [3, 4] at that step"]
