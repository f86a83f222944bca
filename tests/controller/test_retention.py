"""The event ring keeps events by level: registrations never push out deaths. Fake clock."""

from controller.core.retention import KEPT_LONGEST, admit, counts, tier
from controller.core.journal import EventJournal


class Ring:
    """The controller's event journal alone (a pure component), keeping `keep` events."""

    def __init__(self, keep: int) -> None:
        self.journal, self.keep = EventJournal(), keep

    def event(self, now: float, kind: str, subject: str, message: str) -> None:
        self.journal.record(now, kind, subject, message, "", None, max_message_chars=1000, keep=self.keep)

    @property
    def events(self):
        return self.journal.events


def test_tiers():
    assert tier("host", "info") == 0 and tier("cordon", "warning") == 1 and tier("order_failed", "error") == 1
    assert {tier(k, "warning") for k in KEPT_LONGEST} == {2} and tier("death", "info") == 2


def test_a_registration_flood_at_12k_hosts_keeps_the_deaths_swaps_and_rollbacks():
    s = Ring(1000)
    s.event(0.0, "death", "r0", "replica r0 became DEAD")
    s.event(0.1, "swap", "h0", "host s0 takes replica r0 from host h0")
    s.event(0.2, "rollback", "round", "ROLLBACK: ...")
    s.event(0.3, "cordon", "h0", "host h0 cordoned")
    for i in range(12_000):
        s.event(1.0 + i, "host", f"h{i}", f"host h{i} registered: spare pool")
    kinds = [e.kind for e in s.events]
    assert len(kinds) == 1000
    assert kinds[:4] == ["death", "swap", "rollback", "cordon"]  # oldest, and still there
    assert [e.subject for e in s.events[-3:]] == ["h11997", "h11998", "h11999"]  # the newest info stays too
    assert [e.seq for e in s.events] == sorted(e.seq for e in s.events)  # still ordered for paging


def test_a_warning_flood_keeps_the_deaths_but_not_past_the_ring():
    s = Ring(100)
    for i in range(30):
        s.event(float(i), "death", f"r{i}", "died")
    for i in range(500):
        s.event(100.0 + i, "cordon", f"h{i}", "cordoned")
    for i in range(500):
        s.event(1000.0 + i, "host", f"h{i}", "registered")
    kinds = [e.kind for e in s.events]
    assert kinds.count("death") == 30 and kinds.count("cordon") + kinds.count("host") == 70
    assert kinds.count("host") == 25  # info keeps its floor (a quarter of the ring)...
    # ...and warnings keep what is left; the oldest of each tier went first
    assert [e.subject for e in s.events if e.kind == "cordon"][-1] == "h499"


def test_within_the_limit_nothing_is_dropped_and_the_counts_stay_true():
    s = Ring(10)
    for i in range(5):
        s.event(float(i), "death" if i % 2 else "host", "x", "m")
    assert len(s.events) == 5 and s.journal.tiers == counts(s.events) == [3, 0, 2]
    events, tiers = [], [0, 0, 0]
    for e in s.events:
        admit(events, tiers, e, 2)  # a tiny ring: the floor is one per tier
    assert [e.kind for e in events] == ["death", "host"] and tiers == [1, 0, 1]
