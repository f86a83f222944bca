"""Shared pytest fixtures. Keep each one small; put helpers in their own modules."""

from __future__ import annotations

import pytest

from tests.etcd_server import EtcdServer


@pytest.fixture(scope="session")
def etcd():
    """One real etcd for the whole session (see tests/etcd_server.py). Tests share it, so
    each uses its own key prefix. Skips when etcd is not installed (fails when CI=true)."""
    server = EtcdServer.start_new()
    try:
        yield server
    finally:
        server.close()
