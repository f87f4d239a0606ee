"""Fixtures the integration tests share."""

from __future__ import annotations

import pytest

from tests.helpers.dht_world import dht_world  # noqa: F401 (a fixture for the DHT tests)


@pytest.fixture
def nodes():
    """The node processes a test starts (append each ``NodeProc``); each is stopped by its PID at the end."""
    started = []
    yield started
    for node in started:
        node.stop()
