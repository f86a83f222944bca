"""The credential checks of the gRPC handlers and the quorum port (controller/core/credentials.py
decides; this reads the request and the state it needs). Each raises PermissionDenied."""

from __future__ import annotations

from controller.core.checks import check_id, check_optional_id


def check_registration(server, request) -> None:
    limit = server.settings.max_id_chars
    check_id("host_id", request.host_id, limit)  # bounded before anything is computed of it
    check_id("incarnation", request.incarnation, limit)
    server.credentials.check_registration(request.host_id, request.incarnation, request.proof, server.clock())


def check_coordinator(server, state, request) -> None:
    """A coordinator's call (a join, a commit, a failure or finish report): its credential must
    let it act for the replica it names."""
    limit = server.settings.max_id_chars
    check_id("replica_id", request.replica_id, limit)  # bounded before anything is computed of it
    check_optional_id("host_id", request.host_id, limit)
    server.credentials.check_coordinator(request.credential, request.replica_id, request.host_id,
                                         state.rank_holders.get((request.replica_id, 0)))


def check_beat(server, state, beat) -> None:
    """A heartbeat: each live host it names proves its agent's secret, each replica its
    coordinator's credential. Unknown and dead ids are left to the answer (register or join again)."""
    if not server.credentials.enabled:
        return
    for host_id in beat.host_ids:
        if host_id in state.hosts:
            state.authenticate_agent(host_id, beat.agent_secret)
    for replica_id in beat.replica_ids:
        if replica_id in state.replicas:
            server.credentials.check_coordinator(beat.credential, replica_id, beat.host_id,
                                                 state.rank_holders.get((replica_id, 0)))
