"""The blocking bounded wait the suites share."""

import pytest

from tests.waiting import wait_until


def test_wait_until_returns_the_first_truthy_value_and_paces_as_told():
    looks, pauses = [], []
    value = wait_until(lambda: looks.append(1) or (len(looks) >= 3 and "ready"), 10, "three looks",
                       every_s=lambda: pauses.append(0.001) or 0.001)
    assert value == "ready" and len(looks) == 3 and len(pauses) == 2


def test_wait_until_fails_naming_what_it_waited_for():
    with pytest.raises(AssertionError, match="timed out after 0.05 s waiting for the impossible"):
        wait_until(lambda: False, 0.05, "the impossible", every_s=0.01)
