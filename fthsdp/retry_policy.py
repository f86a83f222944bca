"""Counting failed steps in a row (pure): errors become votes until the budget is spent."""

from __future__ import annotations

from dataclasses import dataclass


class RetryLimitExceeded(RuntimeError):
    """More than `max_retries` steps in a row failed to commit; the replica gives up."""


@dataclass(frozen=True)
class RetryState:
    failures_in_a_row: int = 0
    last_reason: str = ""


def after_commit(_state: RetryState) -> RetryState:
    """A commit resets the count."""
    return RetryState()


def after_failure(state: RetryState, reason: str, max_retries: int) -> tuple[RetryState, bool]:
    """Record one failed step; returns the new state and whether to give up.

    `max_retries` failed steps in a row are tolerated; the next one gives up.
    """
    new = RetryState(state.failures_in_a_row + 1, reason)
    return new, new.failures_in_a_row > max_retries


def give_up_message(state: RetryState, max_retries: int, step: int) -> str:
    return (f"step {step} failed {state.failures_in_a_row} times in a row, more than "
            f"max_retries={max_retries}; last failure: {state.last_reason}")
