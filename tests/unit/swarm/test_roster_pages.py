"""#27: a node reads the roster in pages of ROSTER_PAGE_SHARDS shards, never whole, however full it is;
the shards of authors whose notices wait for their card come first; after the first pass, pages come as
often as the record lifetime asks (``roster_page_gap_s``), not every 2 s.

The worst case is a full roster: every shard holding its 64 cards (512 identities). The old reader took
all 8 shards (512 cards, up to 4 MiB) in every read, every 2 s."""

from __future__ import annotations

import time

import pytest

from benchmarks.harness.waiting import wait_until
from swarmnode.identity import Identity
from swarmnode.swarm.exchange import service as service_module
from swarmnode.swarm.exchange.roster import VIEW_SIZE
from swarmnode.swarm.exchange.service import ROSTER_PAGE_SHARDS, roster_page_gap_s
from swarmnode.swarm.wire import dht_rules
from tests.helpers.scripted_net import signed_card


def _fill_roster(world) -> set[str]:
    """Every shard filled to MAX_SUBKEYS_PER_KEY cards, each at the key its peer id names, of peers with
    standing (a roster holds only PROBATION_CARDS of peers without)."""
    peers: set[str] = set()
    while len(peers) < dht_rules.ROSTER_SHARDS * dht_rules.MAX_SUBKEYS_PER_KEY:
        identity = Identity.generate()
        key = dht_rules.roster_key(world.swarm_id, identity.peer_id)
        if len(world.net.store.get(key, {})) < dht_rules.MAX_SUBKEYS_PER_KEY:
            card = signed_card(identity, world.swarm_id, world.roster.fingerprint, 1)
            world.net.put(key, identity.peer_id, card, 60)
            world.book.credit_trained(identity.peer_id)
            peers.add(identity.peer_id)
    return peers


def _recording_reads(world, times: list[float] | None = None) -> list[list[str]]:
    """The roster keys of each DHT read the service makes from now on (and, into ``times``, when)."""
    reads: list[list[str]] = []
    get_many = world.net.get_many

    def recorded(keys, timeout_s=None):
        roster = [key for key in keys if "/roster/" in key]
        if roster:
            reads.append(roster)
            if times is not None:
                times.append(time.monotonic())
        return get_many(keys, timeout_s)

    world.net.get_many = recorded
    return reads


def test_a_full_roster_is_read_in_pages_that_fill_the_view_and_reach_every_shard(world):
    peers = _fill_roster(world)
    reads = _recording_reads(world)
    world.service.start()
    assert wait_until(lambda: len(world.roster.cards) == VIEW_SIZE, 20), len(world.roster.cards)
    assert set(world.roster.cards) <= peers  # the view (test_view.py), from the DHT's 512 cards
    pages_per_pass = dht_rules.ROSTER_SHARDS // ROSTER_PAGE_SHARDS
    assert wait_until(lambda: len(reads) >= pages_per_pass, 20), reads  # the first pass goes on
    assert reads and max(len(keys) for keys in reads) == ROSTER_PAGE_SHARDS  # the old reader: 8 every time
    first_pass = [key for keys in reads[:pages_per_pass] for key in keys]
    assert sorted(first_pass) == sorted(dht_rules.roster_keys(world.swarm_id))


def test_a_parked_notices_author_has_its_shard_read_first(world):
    newcomer = Identity.generate()
    shard = dht_rules.roster_shard(newcomer.peer_id)
    world.service.inbox.parked_authors = lambda: [newcomer.peer_id]
    assert world.service._roster_page()[0] == shard
    world.service.inbox.parked_authors = lambda: []
    turns = [world.service._roster_page() for _ in range(dht_rules.ROSTER_SHARDS // ROSTER_PAGE_SHARDS)]
    assert sorted(s for page in turns for s in page) == list(range(dht_rules.ROSTER_SHARDS))


def test_notices_naming_unknown_authors_in_every_shard_cannot_stop_the_turn(world):
    """The worst case for the parked-first rule: a sender keeps a notice of an unknown author parked in
    every shard. Parked shards never take the whole page, so every shard is still read within
    ROSTER_SHARDS pages (and the cards of the peers there stay fresh)."""
    strangers = {}
    while len(strangers) < dht_rules.ROSTER_SHARDS:
        identity = Identity.generate()
        strangers.setdefault(dht_rules.roster_shard(identity.peer_id), identity.peer_id)
    world.service.inbox.parked_authors = lambda: list(strangers.values())
    pages = [world.service._roster_page() for _ in range(dht_rules.ROSTER_SHARDS)]
    assert all(len(page) == ROSTER_PAGE_SHARDS for page in pages)
    assert {shard for page in pages for shard in page} == set(range(dht_rules.ROSTER_SHARDS))


@pytest.mark.parametrize("ttl_s", [60.0, 120.0, 450.0])  # the shortest lifetime, the public demo's, the most
def test_a_pass_reads_every_card_well_within_the_time_that_keeps_its_peer_live(ttl_s):
    """A card is re-signed every ttl / 4 and keeps its peer live for ttl / 2: a pass over the shards must
    take at most ttl / 4, so that a peer that announces nothing is never dropped between passes."""
    pass_s = dht_rules.ROSTER_SHARDS / ROSTER_PAGE_SHARDS * roster_page_gap_s(ttl_s)
    assert pass_s <= ttl_s / 4
    assert roster_page_gap_s(ttl_s) >= service_module.ROSTER_REFRESH_S


def test_after_the_first_pass_pages_come_at_the_record_lifetimes_pace(world, monkeypatch):
    """The old reader read a page every 2 s whatever the lifetime, so a full roster cost a node 128 cards
    every 2 s (docs/scaling.md: the bytes that still grew with the swarm). Now the first pass is back to
    back and the pages after it come every ``roster_page_gap_s`` (here 1 s)."""
    pages_per_pass = dht_rules.ROSTER_SHARDS // ROSTER_PAGE_SHARDS
    monkeypatch.setattr(service_module, "ROSTER_PASSES_PER_TTL", world.roster.ttl_s / pages_per_pass)
    assert roster_page_gap_s(world.roster.ttl_s) == pytest.approx(1.0)
    times: list[float] = []
    _recording_reads(world, times)
    world.service.start()
    assert wait_until(lambda: len(times) >= pages_per_pass + 3, 15), times
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps[: pages_per_pass - 1]) < 0.9  # the first pass: back to back
    assert min(gaps[pages_per_pass:]) > 0.9  # then at the lifetime's pace (the old code: every 0.2 s)
