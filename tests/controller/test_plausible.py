"""A joining replica's step must be one the job's history could have reached (pure table)."""

from __future__ import annotations

import pytest

from controller.core.admission import step_problem


@pytest.mark.parametrize("step, quorum_max_step, committed, allowed", [
    (10**9, None, -1, True),     # no history (new job, lost in-memory store): the replicas' word
    (0, 0, -1, True),
    (1, 0, -1, True),            # a member of the quorum for step 0 committed it
    (2, 0, -1, False),           # nobody could have trained step 1
    (10**9, 5, 5, False),        # the newcomer far ahead
    (7, 5, 6, True),             # the newest commit is past the quorum's step (reports came in)
    (8, 5, 6, False),
    (3, 2, 10, True),            # behind is always plausible (catch-up, rollback)
])
def test_a_step_beyond_the_history_is_refused(step, quorum_max_step, committed, allowed):
    problem = step_problem("zz", step, quorum_max_step, committed)
    assert (problem is None) == allowed
    if problem:
        known = max(committed, quorum_max_step)
        assert f"step {step}" in problem and f"at most step {known + 1}" in problem


@pytest.mark.parametrize("step, allowed", [(6, True), (7, True), (8, False), (10**9, False)])
def test_a_member_of_the_current_quorum_may_ask_for_one_step_more(step, allowed):
    """Its commit report of step 6 may have died with a deposed leader (a fast-path round
    writes nothing): it asks for 7; never for more."""
    assert (step_problem("r0", step, 5, 4, member=True) is None) == allowed
