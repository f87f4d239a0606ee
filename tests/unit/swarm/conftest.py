"""The data plane's stages on the scripted network (tests/helpers/scripted_net.py), for the tests of
swarm.exchange that need no libp2p daemon."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from swarmnode.swarm.exchange import puller
from swarmnode.swarm.exchange import service as service_module
from swarmnode.swarm.exchange.service import ExchangeService
from tests.helpers.scripted_net import Author, data_plane_parts

WORLD_PEER_GROUPS = 4  # J of the node the world's data plane serves (the tiny config's)


@pytest.fixture
def world(tmp_path, bank, monkeypatch):
    """The data plane's stages on the scripted network, wired by a real ExchangeService (not started);
    fast timers for short tests."""
    monkeypatch.setattr(puller, "PULL_TIMEOUT_BASE_S", 0.6)
    monkeypatch.setattr(puller, "BACKOFF_BASE_S", 0.8)
    monkeypatch.setattr(service_module, "POLL_INTERVAL_S", 0.2)
    monkeypatch.setattr(service_module, "ROSTER_REFRESH_S", 0.2)
    monkeypatch.setattr(service_module, "ROSTER_PASSES_PER_TTL", 1000)  # pages every ROSTER_REFRESH_S
    parts = data_plane_parts(tmp_path, bank)
    net, swarm_id = parts.net, parts.swarm_id
    service = ExchangeService(
        transport=net, swarm_id=swarm_id, roster=parts.roster, verifier=parts.verifier, book=parts.book,
        arrivals=parts.arrivals, trace=parts.trace, pulls_per_round=puller.pull_budget(WORLD_PEER_GROUPS),
    )  # fmt: skip
    world = SimpleNamespace(
        net=net, arrivals=parts.arrivals, roster=parts.roster, verifier=parts.verifier, book=parts.book,
        service=service, swarm_id=swarm_id,
        authors=lambda n, standing=False, **kw: _authors(parts, bank, n, standing, **kw),
        start=lambda: _start(service),
    )  # fmt: skip
    yield world
    service.stop()


def _authors(parts, bank, n: int, standing: bool, **kw) -> list[Author]:
    """``n`` authors; with ``standing`` each has had a group trained on here already."""
    authors = [Author(parts.net, parts.swarm_id, bank, **kw) for _ in range(n)]
    for author in authors if standing else []:
        parts.book.credit_trained(author.peer_id)
    return authors


def _start(service: ExchangeService) -> None:
    """Read every roster shard, then start the service: it reads the roster in pages, and a test about
    what is pulled should not depend on which page an author's card is in (test_roster_pages.py tests
    the pages)."""
    service.refresh_roster()
    service.start()
