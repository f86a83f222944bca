"""The rule agents and trainers share for a controller that does not answer
(`protos.dial.Outage`), on a fake clock: when to say so, and when to give up."""

from __future__ import annotations

from protos.dial import Outage


def test_a_first_connection_gives_up_after_the_short_timeout_and_a_reconnection_after_the_long_one():
    o = Outage(10.0, 300.0)
    assert not o.failed(100.0, 1.0) and o.attempts == 1 and o.length(104.0) == 4.0
    assert not o.failed(108.0, 2.0)  # 8 s without an answer, next try at 10 s: still within
    assert o.failed(109.5, 1.0) and o.attempts == 3  # the next try would be at 10.5 s
    assert (o.limit_s, o.limit_name) == (10.0, "connect timeout")
    o.succeeded()  # an answer: a new outage starts from nothing, and is a reconnection
    assert o.length(200.0) == 0.0 and (o.limit_s, o.limit_name) == (300.0, "reconnect timeout")
    assert not o.failed(200.0, 9.0) and o.attempts == 1
    assert not o.failed(480.0, 10.0)  # 290 s in: within the reconnect timeout
    assert o.failed(495.0, 10.0)


def test_failed_attempts_are_worth_a_line_once_per_doubling_of_their_count():
    o = Outage(1e9, 1e9)
    logged = []
    for n in range(1, 1001):
        o.failed(float(n), 1.0)
        if o.worth_a_line:
            logged.append(o.attempts)
    assert logged == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]  # 10 lines for 1000 attempts
    o.succeeded()
    o.failed(2000.0, 1.0)
    assert o.worth_a_line  # a new outage is said at once


def test_the_lines_of_an_outage_match_a_naive_count():
    o = Outage(1e9, 1e9)
    for n in range(1, 5000):
        o.failed(float(n), 0.0)
        assert o.worth_a_line == (n in {2 ** k for k in range(13)})
