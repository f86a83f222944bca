"""ControllerCore: the controller's one entry, `step(command, now) -> Ready`.

    shell:  ready = core.step(command, now); execute(ready): write ready.writes, then deliver
            ready.orders and answer, then write ready.writes_behind; a failed write comes
            back as core.step(WriteFailed(sections, orders), now)
            (controller/service/server.py `ControllerServer.execute`: the only place that applies a Ready)

It is the only way to change the controller's state: the state object is private
(`_state`); the service and the tests read it through `core.view` (controller/core/view.py),
which has no verb that changes anything, and drive it with commands (controller/core/commands.py).

The state the core decides on (`ControllerState`, controller/core/state.py) holds three
kinds of record -- hosts, replicas and the job -- each with its own lifecycle, drawn once in
its state enum's docstring with the transition table the code checks (controller/core/model.py:
HostState, ReplicaState, JobState).

Every command below is one handler: it changes the state through the components'
public methods, and the step collects what that asks of the shell into one `Ready`:
the sections the change left unwritten (`PendingWrites`: before the answer unless they
may be written behind), the orders for agents (`Outbox`), the events, the quorum formed,
when to be woken. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from typing import Callable

from controller.core import commands as c
from controller.core.ready import Ready
from controller.core.state import ControllerState
from controller.core.view import ControllerView
from controller.settings import ControllerSettings

Handler = Callable[[ControllerState, object, float], object]


def _join(s: ControllerState, cmd: c.Join, now: float) -> None:
    s.join(cmd.request, now)


def _report_step(s: ControllerState, cmd: c.ReportStep, now: float) -> None:
    s.report_step(cmd.replica_id, cmd.step, now, **c.arguments(cmd, "replica_id", "step"))


def _commit_failed(s: ControllerState, cmd: c.ReportCommitFailed, now: float) -> None:
    s.report_commit_failed(cmd.replica_id, cmd.step, cmd.reason, now, quorum_id=cmd.quorum_id, host_id=cmd.host_id)


def _register(s: ControllerState, cmd: c.RegisterAgent, now: float):
    hosts = s.host_registry
    return hosts.register_agent(cmd.host_id, cmd.incarnation, now, **c.arguments(cmd, "host_id", "incarnation"))


def _heartbeat(s: ControllerState, cmd: c.Heartbeat, now: float) -> list[str]:
    return s.heartbeat_hosts(cmd.host_ids, now, cmd.finishing_trainers) + s.heartbeat_replicas(cmd.replica_ids, now)


def _trainer_exit(s: ControllerState, cmd: c.TrainerExit, now: float) -> None:
    s.trainer_exit(cmd.host_id, cmd.replica_id, cmd.rank, now, **c.arguments(cmd, "host_id", "replica_id", "rank"))


def _tick(s: ControllerState, cmd: c.Tick, now: float) -> None:
    s.expire(now)


def _takeover(s: ControllerState, cmd: c.Takeover, now: float) -> None:
    if s.host_registry.hosts or s.replicas:  # an empty store is a first start: nobody to wait for
        s.forgive_silence(now, cmd.grace_s, f"controller {cmd.candidate} took over")
    s.leader_elected(cmd.candidate, now)


def _write_failed(s: ControllerState, cmd: c.WriteFailed, now: float) -> None:
    s.writes.failed(cmd.sections)
    s.outbox.put_back(cmd.orders)


HANDLERS: dict[type, Handler] = {
    c.Join: _join,
    c.LeaveRound: lambda s, cmd, now: s.leave_round(cmd.replica_id, cmd.why, now),
    c.ConnectionLost: lambda s, cmd, now: s.coordinator_connection_lost(cmd.replica_id, cmd.how, now),
    c.ReportStep: _report_step,
    c.ReportCommitFailed: _commit_failed,
    c.ReportReplicaDead: lambda s, cmd, now: s.report_replica_dead(cmd.replica_id, cmd.reason, now,
                                                                    host_id=cmd.host_id),
    c.ReportFinished: lambda s, cmd, now: s.report_finished(cmd.replica_id, cmd.step, now, reason=cmd.reason,
                                                            host_id=cmd.host_id),
    c.Heartbeat: _heartbeat,
    c.RegisterAgent: _register,
    c.DeregisterAgent: lambda s, cmd, now: s.deregister_agent(cmd.host_id, cmd.incarnation, cmd.reason, now),
    c.ConnectOrders: lambda s, cmd, now: s.host_registry.orders_on_connect(cmd.host_id, cmd.pending),
    c.AckOrder: lambda s, cmd, now: s.host_registry.ack_order(cmd.host_id, cmd.order_id, cmd.ok, cmd.error, now),
    c.TrainerExit: _trainer_exit,
    c.Telemetry: lambda s, cmd, now: s.report_telemetry(cmd.report, cmd.agent_secret, now),
    c.Drain: lambda s, cmd, now: s.drain(cmd.host_id, now),
    c.Cordon: lambda s, cmd, now: s.host_registry.cordon(cmd.host_id, cmd.reason, now),
    c.Uncordon: lambda s, cmd, now: s.host_registry.uncordon(cmd.host_id, now),
    c.CloseRound: lambda s, cmd, now: None,
    c.Tick: _tick,
    c.Takeover: _takeover,
    c.WriteFailed: _write_failed,
}

#: after these, the open round is looked at (a change may let it close, or drop a member):
#: Ready.quorum is the quorum formed, if one did
LOOK_AT_ROUND = (
    c.CloseRound, c.Tick, c.ReportFinished, c.ReportCommitFailed, c.ReportReplicaDead, c.RegisterAgent,
    c.DeregisterAgent, c.TrainerExit, c.Telemetry, c.Drain, c.Cordon, c.Uncordon,
)


class ControllerCore:
    """The state the controller decides on, reached only through `step`; `view` reads it."""

    def __init__(self, settings: ControllerSettings) -> None:
        self._state = ControllerState(settings)
        #: what the service and the tests read (controller.core.view): nothing in it changes state
        self.view = ControllerView(self._state)

    @classmethod
    def restored(cls, settings: ControllerSettings, replicas: dict | None, host_shards: list[dict | None],
                 now: float, addresses: dict[str, dict] | None = None, journal: dict | None = None) -> ControllerCore:
        """A core that starts from the store sections a previous leader wrote (ControllerState.restore)."""
        core = cls(settings)
        core._state.restore(replicas, host_shards, now, addresses, journal)
        return core

    def step(self, command, now: float) -> Ready:
        """Apply one command at `now`; what the shell must do comes back. A refused command
        (RequestError) raises before anything is asked of the shell."""
        s = self._state
        handler = HANDLERS.get(type(command))
        if handler is None:
            raise TypeError(f"{type(command).__name__} is not a controller command")
        answer = handler(s, command, now)
        quorum = wait_s = members = None
        rounds = s.rounds
        if isinstance(command, LOOK_AT_ROUND):
            first_join = rounds.round_first_join_at
            quorum = s.try_close_round(now)
            if quorum is not None and first_join is not None:
                wait_s = max(now - first_join, 0.0)
            members = frozenset(rounds.round_joined)
        retry = isinstance(command, c.WriteFailed)  # what failed waits for the next chance
        return Ready(
            answer=answer,
            writes=() if retry else s.writes.take(background=False),
            writes_behind=s.writes.take(background=True) if isinstance(command, c.Tick) else (),
            orders=() if retry else s.outbox.take(),
            events=tuple(s.take_events()),
            observations=tuple(s.goodput.take_observations()),
            quorum=quorum, quorum_wait_s=wait_s, wake_at=rounds.round_wake_at, round_members=members,
        )


__all__ = ["ControllerCore", "HANDLERS"]
