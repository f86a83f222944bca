"""What an agent does when the controller refuses its registration. Pure: no I/O, no clock.

A refusal ends the agent only when the controller decided the host may not take part: its
credential (the job secret, the agent secret, a client certificate) is not accepted, or the
host as it is configured (its id, its job, its address, the work it was started with) is
refused before it ever ran anything. A refusal of a registration that carries work this agent
was already running (it registered before: a re-registration after a failover or after it was
forgotten) is a state conflict the controller can resolve: the agent asks again without its
claim, so the controller's record decides what it runs, and its trainers keep running until
that answer says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

#: gRPC status names (StatusCode.name) that mean "this host's credential is not accepted".
CREDENTIAL = frozenset({"PERMISSION_DENIED", "UNAUTHENTICATED"})
#: ...that mean "the controller refuses the request as it stands" (retrying it unchanged cannot help).
REFUSED = frozenset({"FAILED_PRECONDITION", "INVALID_ARGUMENT", "ALREADY_EXISTS"})


@dataclass(frozen=True)
class Verdict:
    exit: bool            # end the agent (its trainers stop)
    drop_claim: bool      # register again without the assignment it claimed
    why: str              # in words, for the log (and the exit)


def after_refusal(code: str, claimed: bool, registered_before: bool) -> Verdict | None:
    """The verdict on a registration refused with status `code` (a StatusCode name); None when
    the code is not a refusal (a transient error: the caller retries as for any failure).
    `claimed`: the request carried an assignment; `registered_before`: this agent process
    registered once already (its trainers may be running)."""
    if code in CREDENTIAL:
        return Verdict(True, False, "the controller does not accept this host's credential: it may not take part")
    if code not in REFUSED:
        return None
    if claimed and registered_before:
        return Verdict(False, True, "a state conflict over the work this host runs: registering again without "
                                    "the claim, so the controller's record decides; its trainers keep running "
                                    "until it answers")
    return Verdict(True, False, "the controller refuses this host as it is configured (its id, job, address or "
                                "the work it was started with): it may not take part")
