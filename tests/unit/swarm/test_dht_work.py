"""BoundedStorage ranks records by their signer's identity work (dht_guard module doc): a home swarm's card
without the swarm's d is refused, and records without work, of any swarm, fill only their share of a key
and of a budget, so free keys never take the room of records with work. Real signed records throughout."""

from __future__ import annotations

import time
from functools import cache

import msgpack
import pytest
from hivemind.dht.routing import DHTID
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.identity import Identity
from swarmnode.swarm.net import dht_guard
from swarmnode.swarm.net.dht_guard import (
    MAX_HOME_RECORDS,
    MAX_STORED_RECORDS,
    MAX_WORKLESS_PER_KEY,
    SHARED,
    BoundedStorage,
)
from swarmnode.swarm.wire import dht_rules
from swarmnode.swarm.wire.dht_rules import MAX_SUBKEYS_PER_KEY, announce_key, roster_key
from tests.helpers import dht_attacker

HOME = "home"
D = 8  # the home swarm's identity_work_bits (tests use 8: a mint is instant)
NOW = 1_767_225_600.0


@cache
def _identity(tag: str, i: int) -> Identity:
    return dht_attacker.sybil(tag.encode(), i)


def _card(identity: Identity, swarm: str = HOME, bits: int = 0) -> bytes:
    return msgpack.packb(dht_attacker.card(identity, swarm, NOW, work_bits=bits), use_bin_type=True)


def _announcement(identity: Identity, swarm: str = HOME, bits: int = 0) -> bytes:
    return msgpack.packb(dht_attacker.announcement(identity, swarm, NOW, work_bits=bits), use_bin_type=True)


def _store_card(storage: BoundedStorage, identity: Identity, swarm: str = HOME, bits: int = 0) -> bool:
    key = DHTID.generate(source=roster_key(swarm, identity.peer_id))
    return storage.store_subkey(key, identity.peer_id, _card(identity, swarm, bits), get_dht_time() + 60)


def _store_announcement(
    storage: BoundedStorage, identity: Identity, swarm: str = HOME, bits: int = 0
) -> bool:
    key = DHTID.generate(source=announce_key(swarm, identity.peer_id))
    return storage.store_subkey(
        key, identity.peer_id, _announcement(identity, swarm, bits), get_dht_time() + 60
    )


def _in_shard(tag: str, shard: int, count: int) -> list[Identity]:
    found = (_identity(tag, i) for i in range(40 * count))
    return [x for x in found if dht_rules.roster_shard(x.peer_id) == shard][:count]


def test_a_home_swarms_card_without_the_swarms_work_is_refused_and_with_it_stored():
    storage = BoundedStorage([HOME], work_bits=D)
    honest = next(  # a key whose 4-bit proof proves fewer than D bits (most do)
        x
        for x in (_identity("card", i) for i in range(100))
        if dht_rules.record_work(_card(x, bits=4)).work_bits < D
    )
    assert not _store_card(storage, honest)  # no nonce
    assert not _store_card(storage, honest, bits=4)  # too little
    assert _store_card(storage, honest, bits=D)
    assert storage.refused_no_work == 2 and storage.held(HOME) == 1


def test_64_work_less_cards_of_the_home_swarm_leave_its_roster_shard_open():
    storage = BoundedStorage([HOME], work_bits=D)
    free = _in_shard("free-card", 0, MAX_SUBKEYS_PER_KEY)
    assert not any(_store_card(storage, identity) for identity in free)
    honest = _in_shard("honest", 0, MAX_SUBKEYS_PER_KEY)
    assert all(_store_card(storage, identity, bits=D) for identity in honest)  # the whole shard is theirs


def test_work_less_announcements_fill_only_a_quarter_of_the_home_budget():
    storage = BoundedStorage([HOME], work_bits=D)
    started = time.perf_counter()
    kept = sum(_store_announcement(storage, _identity("free", i)) for i in range(MAX_HOME_RECORDS))
    took = time.perf_counter() - started
    cap = storage.cap(HOME, workless=True)
    assert kept == cap == MAX_HOME_RECORDS // 4
    assert storage.held(HOME, workless=True) == cap
    with_work = [_identity("paid", i) for i in range(MAX_HOME_RECORDS - cap)]
    assert all(_store_announcement(storage, identity, bits=D) for identity in with_work)
    assert storage.held(HOME) == MAX_HOME_RECORDS  # full now, and only then
    assert not _store_announcement(storage, _identity("paid", 10**6), bits=D)
    print(f"{MAX_HOME_RECORDS} work-less announcements offered in {took:.2f} s (signing them included)")


def test_an_announcement_without_a_nonce_has_work_when_its_signers_card_with_work_is_held():
    storage = BoundedStorage([HOME], work_bits=D)
    for i in range(storage.cap(HOME, workless=True)):  # the work-less share is full
        assert _store_announcement(storage, _identity("free", i))
    known, stranger = _identity("known", 0), _identity("stranger", 0)
    assert _store_card(storage, known, bits=D)
    assert _store_announcement(storage, known)  # its card here vouches for it
    assert not _store_announcement(storage, stranger)  # no card here, no nonce: the full work-less share
    assert _store_announcement(storage, stranger, bits=D)  # its own nonce


def test_other_swarms_records_without_work_fill_a_quarter_of_a_key_and_of_the_shared_budget():
    storage = BoundedStorage([HOME], work_bits=D)
    shard = _in_shard("elsewhere", 3, MAX_SUBKEYS_PER_KEY)
    kept = sum(_store_card(storage, identity, swarm="elsewhere") for identity in shard)
    assert kept == MAX_WORKLESS_PER_KEY  # another swarm's cards are not refused, only ranked
    paid = _in_shard("elsewhere-paid", 3, MAX_SUBKEYS_PER_KEY - MAX_WORKLESS_PER_KEY)
    assert all(_store_card(storage, identity, swarm="elsewhere", bits=D) for identity in paid)
    # the shared budget: a quarter for records without work, whatever their swarm
    kept = sum(
        _store_announcement(storage, _identity("junk", i), swarm=f"junk-{i % 7}")
        for i in range(MAX_STORED_RECORDS // 4 + 64)
    )
    assert (
        storage.held(SHARED, workless=True) == storage.cap(SHARED, workless=True) == MAX_STORED_RECORDS // 4
    )
    assert kept == MAX_STORED_RECORDS // 4 - MAX_WORKLESS_PER_KEY
    assert _store_announcement(storage, _identity("junk-paid", 0), swarm="junk-0", bits=D)


def test_an_update_that_drops_its_work_is_held_to_the_work_less_bounds():
    storage = BoundedStorage(work_bits=D)  # no home swarm: every record in the shared budget
    shard = _in_shard("update", 0, MAX_WORKLESS_PER_KEY + 1)
    for identity in shard[:MAX_WORKLESS_PER_KEY]:
        assert _store_card(storage, identity, swarm="s")
    last = shard[-1]
    assert _store_card(storage, last, swarm="s", bits=D)
    assert not _store_card(storage, last, swarm="s")  # the key's work-less share is full
    assert _store_card(storage, last, swarm="s", bits=D)  # an update that keeps its work goes through
    assert storage.held(SHARED) == MAX_WORKLESS_PER_KEY + 1


def test_expired_work_less_records_free_their_share(monkeypatch):
    storage, now = BoundedStorage(work_bits=D), get_dht_time()
    for i in range(storage.cap(SHARED, workless=True)):
        key = DHTID.generate(source=announce_key("s", _identity("old", i).peer_id))
        assert storage.store_subkey(
            key, _identity("old", i).peer_id, _announcement(_identity("old", i), "s"), now + 5
        )
    assert not _store_announcement(storage, _identity("late", 0), swarm="s")
    monkeypatch.setattr(dht_guard, "get_dht_time", lambda: now + 10)
    monkeypatch.setattr("hivemind.utils.timed_storage.get_dht_time", lambda: now + 10)
    key = DHTID.generate(source=announce_key("s", _identity("late", 0).peer_id))
    assert storage.store_subkey(
        key, _identity("late", 0).peer_id, _announcement(_identity("late", 0), "s"), now + 60
    )
    assert storage.held(SHARED, workless=True) == 1


def test_at_d_0_every_record_has_work():
    storage = BoundedStorage([HOME], work_bits=0)
    assert _store_card(storage, _identity("card", 0))
    assert storage.held(HOME, workless=True) == 0


@pytest.mark.parametrize("pad", [0, 7700])
def test_reading_a_records_work_costs_microseconds(pad):
    """The fastest of 5 batches (a batch alone can be preempted on a busy machine)."""
    identity = _identity("cost", 0)
    value = msgpack.packb(dht_attacker.card(identity, HOME, NOW, pad=pad, work_bits=D), use_bin_type=True)
    assert dht_rules.record_work(value).work_bits >= D
    batches = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(200):
            dht_rules.record_work(value)
        batches.append((time.perf_counter() - started) / 200)
    per_read = min(batches)
    print(f"record_work of a {len(value)}-byte record: {per_read * 1e6:.1f} us")
    assert per_read < 200e-6
