"""Driver: tests drive the controller's core the one way the service does, by commands.

`d = Driver(settings)`; each verb builds one command (controller.core.commands), steps the
core with it (`ControllerCore.step(command, now)`) and returns what the service would read of
its Ready (the answer, or the quorum formed). What Readys hand out to the shell -- orders,
events, observations -- is kept here in the order the steps produced them, for `take_orders`
and the like. Tests read the state through `d.view` (controller.core.view), never change it.
"""

from __future__ import annotations

from controller.core import commands as c
from controller.core.core import ControllerCore
from controller.core.host_records import HOST_SHARDS
from controller.core.model import Event, JobState, JoinRequest, OrderOut, Quorum
from controller.core.ready import Ready
from controller.settings import ControllerSettings


class Driver:
    def __init__(self, settings: ControllerSettings, core: ControllerCore | None = None) -> None:
        self.core = core if core is not None else ControllerCore(settings)
        self.view = self.core.view
        self.settings = self.view.settings
        #: what the Readys so far handed out and the test has not taken yet
        self.orders: list[OrderOut] = []
        self.events: list[Event] = []
        self.observations: list = []
        #: the last step's Ready
        self.ready: Ready | None = None

    @classmethod
    def restored(cls, settings: ControllerSettings, replicas: dict | None, host_shards: list, now: float,
                 addresses: dict | None = None, journal: dict | None = None) -> Driver:
        """A driver of a core started from these store sections (a successor's takeover)."""
        return cls(settings, ControllerCore.restored(settings, replicas, host_shards, now, addresses, journal))

    def step(self, command, now: float) -> Ready:
        ready = self.core.step(command, now)
        self.orders += ready.orders
        self.events += ready.events
        self.observations += ready.observations
        self.ready = ready
        return ready

    # -- agents ----------------------------------------------------------------------------------

    def register(self, host_id: str, incarnation: str, now: float, **fields):
        return self.step(c.RegisterAgent(host_id, incarnation, **fields), now).answer

    def deregister(self, host_id: str, incarnation: str, reason: str, now: float) -> str:
        return self.step(c.DeregisterAgent(host_id, incarnation, reason), now).answer

    def beat_hosts(self, host_ids, now: float, finishing_trainers: int = 0) -> list[str]:
        return self.step(c.Heartbeat(tuple(host_ids), (), finishing_trainers), now).answer

    def beat_replicas(self, replica_ids, now: float) -> list[str]:
        return self.step(c.Heartbeat((), tuple(replica_ids)), now).answer

    def exit(self, host_id: str, replica_id: str, rank: int, now: float, **fields) -> None:
        self.step(c.TrainerExit(host_id, replica_id, rank, **fields), now)

    def telemetry(self, report, agent_secret: str, now: float) -> list[str]:
        return self.step(c.Telemetry(report, agent_secret), now).answer

    def connect_orders(self, host_id: str, pending: OrderOut | None = None) -> list[OrderOut]:
        """A host opens its order stream (the command reads no clock: `now` is 0)."""
        return self.step(c.ConnectOrders(host_id, pending), 0.0).answer

    # -- operators -------------------------------------------------------------------------------

    def drain(self, host_id: str, now: float) -> str:
        return self.step(c.Drain(host_id), now).answer

    def cordon(self, host_id: str, reason: str, now: float) -> None:
        self.step(c.Cordon(host_id, reason), now)

    def uncordon(self, host_id: str, now: float) -> None:
        self.step(c.Uncordon(host_id), now)

    # -- coordinators ----------------------------------------------------------------------------

    def join(self, request: JoinRequest, now: float) -> None:
        self.step(c.Join(request), now)

    def leave(self, replica_id: str, why: str, now: float) -> bool:
        return self.step(c.LeaveRound(replica_id, why), now).answer

    def connection_lost(self, replica_id: str, how: str, now: float) -> bool:
        return self.step(c.ConnectionLost(replica_id, how), now).answer

    def report(self, replica_id: str, step: int, now: float, **fields) -> None:
        self.step(c.ReportStep(replica_id, step, **fields), now)

    def commit_failed(self, replica_id: str, step: int, reason: str, now: float, **fields) -> None:
        self.step(c.ReportCommitFailed(replica_id, step, reason, **fields), now)

    def report_dead(self, replica_id: str, reason: str, now: float, **fields) -> None:
        self.step(c.ReportReplicaDead(replica_id, reason, **fields), now)

    def finished(self, replica_id: str, step: int, now: float, **fields) -> JobState:
        return self.step(c.ReportFinished(replica_id, step, **fields), now).answer

    # -- the controller's own ----------------------------------------------------------------------

    def close_round(self, now: float) -> Quorum | None:
        """A look at the round: the quorum it formed, if it did."""
        return self.step(c.CloseRound(), now).quorum

    def tick(self, now: float) -> Ready:
        """The ticker: silence expires, digests are compared, the diagnosis runs, the round is looked at."""
        return self.step(c.Tick(), now)

    def takeover(self, candidate: str, grace_s: float, now: float) -> None:
        self.step(c.Takeover(candidate, grace_s), now)

    # -- what the Readys handed out ----------------------------------------------------------------

    def take_orders(self) -> list[OrderOut]:
        out, self.orders = self.orders, []
        return out

    def take_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    def take_observations(self) -> list:
        out, self.observations = self.observations, []
        return out


def stored(d: Driver) -> tuple[dict, list[dict]]:
    """The replicas section and every host shard as `d`'s core would write them now (what a
    successor loads: `Driver.restored(settings, *stored(d), now)`)."""
    return d.view.snapshot_replicas(), [d.view.snapshot_hosts(i) for i in range(HOST_SHARDS)]
