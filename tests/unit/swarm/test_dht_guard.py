"""BoundedStorage: the DHT storage every node installs holds a bounded number of records, and a store
costs the same whether it holds ten records or thousands."""

from __future__ import annotations

import time

import pytest
from hivemind.dht.routing import DHTID
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.swarm.net import dht_guard
from swarmnode.swarm.net.dht_guard import MAX_KEYS_PER_PEER, MAX_STORED_RECORDS, BoundedStorage
from swarmnode.swarm.wire.dht_rules import MAX_SUBKEYS_PER_KEY


def _key(i: int) -> DHTID:
    return DHTID.generate(source=f"key-{i}")


def _fill(storage: BoundedStorage, n: int, expiration: float) -> None:
    for i in range(n):  # distinct keys and signers: only the total bound applies
        assert storage.store_subkey(_key(i // 32), f"peer-{i}".encode(), b"v", expiration)


def test_a_key_holds_at_most_max_subkeys_and_updates_of_held_records_still_go_through():
    storage, expiration = BoundedStorage(), get_dht_time() + 60
    for i in range(MAX_SUBKEYS_PER_KEY):
        assert storage.store_subkey(_key(0), f"peer-{i}".encode(), b"v", expiration)
    assert not storage.store_subkey(_key(0), b"one-too-many", b"v", expiration)
    assert storage.store_subkey(_key(0), b"peer-0", b"newer", expiration + 1)
    assert storage.refused == 1 and storage.records == MAX_SUBKEYS_PER_KEY


def test_a_signer_holds_records_under_at_most_max_keys():
    storage, expiration = BoundedStorage(), get_dht_time() + 60
    for i in range(MAX_KEYS_PER_PEER):
        assert storage.store_subkey(_key(i), b"sybil", b"v", expiration)
    assert not storage.store_subkey(_key(MAX_KEYS_PER_PEER), b"sybil", b"v", expiration)


def test_the_total_is_bounded_and_expired_records_free_their_slots(monkeypatch):
    storage, now = BoundedStorage(), get_dht_time()
    _fill(storage, MAX_STORED_RECORDS, now + 5)
    assert not storage.store_subkey(_key(10**6), b"late", b"v", now + 60)
    assert storage.records == MAX_STORED_RECORDS
    monkeypatch.setattr(dht_guard, "get_dht_time", lambda: now + 10)
    monkeypatch.setattr("hivemind.utils.timed_storage.get_dht_time", lambda: now + 10)
    assert storage.store_subkey(_key(10**6), b"late", b"v", now + 60)
    assert storage.records == 1


def test_a_whole_dictionary_is_stored_record_by_record_and_plain_values_are_refused():
    from hivemind.dht.storage import DictionaryDHTValue

    storage, expiration = BoundedStorage(), get_dht_time() + 60
    whole = DictionaryDHTValue()
    for i in range(MAX_SUBKEYS_PER_KEY + 5):
        whole.store(f"peer-{i}".encode(), b"v", expiration)
    assert storage.store(_key(0), whole, expiration)
    assert storage.records == MAX_SUBKEYS_PER_KEY
    assert not storage.store(_key(1), b"plain", expiration)


def test_a_store_never_walks_the_storage(monkeypatch):
    """The previous version counted every record on each new subkey: O(n) per store, O(n^2) per flood."""
    storage, expiration = BoundedStorage(), get_dht_time() + 600
    _fill(storage, MAX_STORED_RECORDS // 2, expiration)

    def walked(*_args, **_kwargs):
        raise AssertionError("store walked the storage")

    monkeypatch.setattr(BoundedStorage, "items", walked)
    assert storage.store_subkey(_key(10**6), b"new", b"v", expiration)


@pytest.mark.parametrize("held", [64, MAX_STORED_RECORDS - 64])
def test_a_store_costs_about_the_same_nearly_empty_and_nearly_full(held):
    storage, expiration = BoundedStorage(), get_dht_time() + 600
    _fill(storage, held, expiration)
    t = time.perf_counter()
    for i in range(64):
        storage.store_subkey(_key(10**6 + i), f"x-{i}".encode(), b"v", expiration)
    per_store = (time.perf_counter() - t) / 64
    assert per_store < 1e-3, f"{per_store * 1e6:.0f} us per store with {held} records held"
