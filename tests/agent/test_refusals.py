"""agent.refusals: which refused registrations end the agent. Pure."""

import pytest

from agent.refusals import after_refusal


@pytest.mark.parametrize("code", ["PERMISSION_DENIED", "UNAUTHENTICATED"])
@pytest.mark.parametrize("claimed,before", [(False, False), (True, True)])
def test_a_credential_refusal_always_ends_the_agent(code, claimed, before):
    v = after_refusal(code, claimed, before)
    assert v.exit and not v.drop_claim and "credential" in v.why


@pytest.mark.parametrize("code", ["FAILED_PRECONDITION", "INVALID_ARGUMENT", "ALREADY_EXISTS"])
def test_a_refused_claim_of_running_work_is_asked_again_without_it(code):
    v = after_refusal(code, claimed=True, registered_before=True)
    assert not v.exit and v.drop_claim and "trainers keep running" in v.why


@pytest.mark.parametrize("claimed,before", [(True, False), (False, True), (False, False)])
def test_a_refusal_of_the_host_as_configured_ends_it(claimed, before):
    v = after_refusal("FAILED_PRECONDITION", claimed, before)
    assert v.exit and not v.drop_claim and "as it is configured" in v.why


@pytest.mark.parametrize("code", ["UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "INTERNAL"])
def test_transient_errors_are_no_refusal(code):
    assert after_refusal(code, True, True) is None
