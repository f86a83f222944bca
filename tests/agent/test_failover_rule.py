"""The failover rule agents and trainers share (protos.dial.AddressRotation): one pass over
every address without pausing, the leader a standby names first, then capped doubling pauses."""

from __future__ import annotations

import grpc
import pytest

from protos.dial import LEADER_METADATA_KEY, AddressRotation, leader_hint

A, B, C = "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"


def test_a_whole_pass_without_pausing_then_doubling_pauses_up_to_the_cap():
    r = AddressRotation([A, B, C], base_s=0.2, cap_s=1.0)
    tried, delays = [r.current], []
    for _ in range(12):
        delays.append(r.failed())
        tried.append(r.current)
    assert tried[:7] == [A, B, C, A, B, C, A]
    # Pauses only between passes: 0.2, 0.4, 0.8, then the cap.
    assert delays == [0, 0, 0.2, 0, 0, 0.4, 0, 0, 0.8, 0, 0, 1.0]


def test_a_success_ends_the_outage():
    r = AddressRotation([A, B], base_s=0.2, cap_s=1.0)
    for _ in range(6):
        r.failed()
    r.succeeded()
    assert [r.failed(), r.failed()] == [0, 0.2]  # the next outage starts with an immediate pass


def test_the_leader_a_standby_names_is_tried_next_but_only_if_configured():
    r = AddressRotation([A, B, C], base_s=0.2, cap_s=1.0)
    assert r.failed(hint=C) == 0 and r.current == C  # straight to the named leader
    assert r.failed(hint="evil.example:443") == 0 and r.current == A  # not ours: plain next
    # Hints cannot keep a client spinning without pauses: they count toward the pass.
    assert r.failed(hint=B) > 0 and r.current == B


def test_jitter_only_shortens_a_pause():
    r = AddressRotation([A], base_s=0.5, cap_s=1.0)
    assert r.failed(jitter=0.5) == pytest.approx(0.25)
    assert r.failed(jitter=7.0) == pytest.approx(0.01)  # clamped: never zero, never negative


@pytest.mark.parametrize("kw,words", [
    (dict(addresses=[], base_s=0.1, cap_s=1.0), "at least one address"),
    (dict(addresses=[A], base_s=2.0, cap_s=1.0), "base_s=2.0 cap_s=1.0"),
    (dict(addresses=[A], base_s=0.0, cap_s=1.0), "base_s=0.0"),
])
def test_bad_settings_are_refused_naming_the_value(kw, words):
    with pytest.raises(ValueError, match=words.replace(".", r"\.")):
        AddressRotation(kw.pop("addresses"), **kw)


class _Refusal(grpc.RpcError):
    def __init__(self, metadata):
        self._metadata = metadata

    def trailing_metadata(self):
        return self._metadata


def test_leader_hint_reads_the_refusals_metadata():
    assert leader_hint(_Refusal(((LEADER_METADATA_KEY, B), ("other", "x")))) == B
    assert leader_hint(_Refusal(())) == ""
    assert leader_hint(_Refusal(None)) == ""
