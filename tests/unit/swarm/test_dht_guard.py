"""BoundedStorage: the DHT storage every node installs holds a bounded number of records, a store costs
the same whether it holds ten records or thousands, and records of no home swarm cannot refuse the home
swarms' records. BoundedSerializer: what hivemind decodes from peers before validation is bounded."""

from __future__ import annotations

import time

import msgpack
import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import get_dht_time

from swarmnode.swarm.net import dht_guard
from swarmnode.swarm.net.dht_guard import (
    MAX_DECODE_BYTES,
    MAX_HOME_RECORDS,
    MAX_KEYS_PER_PEER,
    MAX_STORED_RECORDS,
    SHARED,
    BoundedSerializer,
    BoundedStorage,
    DecodeRefused,
)
from swarmnode.swarm.wire.dht_rules import MAX_SUBKEYS_PER_KEY, announce_key, roster_key
from swarmnode.swarm.wire.limits import MAX_PEER_ID_BYTES, MAX_RECORD_BYTES
from tests.helpers.dht_attacker import msgpack_bomb


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


@pytest.mark.parametrize("held", [64, MAX_STORED_RECORDS - 80])
def test_a_store_costs_about_the_same_nearly_empty_and_nearly_full(held):
    """The fastest of 5 batches: one batch alone failed once beside a busy process (preempted mid-batch)."""
    storage, expiration = BoundedStorage(), get_dht_time() + 600
    _fill(storage, held, expiration)
    batches = []
    for batch in range(5):
        t = time.perf_counter()
        for i in range(16):
            n = 10**6 + 16 * batch + i
            assert storage.store_subkey(_key(n), f"x-{n}".encode(), b"v", expiration)
        batches.append((time.perf_counter() - t) / 16)
    per_store = min(batches)
    assert per_store < 1e-3, f"{per_store * 1e6:.0f} us per store with {held} records held"


def _id(key: str) -> DHTID:
    return DHTID.generate(source=key)


def test_junk_keys_filling_the_shared_budget_leave_the_home_swarms_own_records_room():
    storage, expiration = BoundedStorage(home_swarms=["home"]), get_dht_time() + 60
    _fill(storage, MAX_STORED_RECORDS, expiration)  # 4,096 records of junk keys: the whole shared budget
    assert not storage.store_subkey(_key(10**6), "junk", b"v", expiration)
    assert storage.store_subkey(_id(roster_key("home", "honest")), "honest", b"card", expiration)
    assert storage.store_subkey(_id(announce_key("home", "honest")), "honest", b"announcement", expiration)
    assert storage.held("home") == 2 and storage.held(SHARED) == MAX_STORED_RECORDS


def test_a_home_swarm_has_a_budget_of_its_own_and_only_its_own_keys_count_in_it():
    storage, expiration = BoundedStorage(home_swarms=["home", "second"]), get_dht_time() + 60
    assert storage.budget_of(_id(roster_key("home", "p")), "p") == "home"
    assert storage.budget_of(_id(announce_key("second", "p")), "p") == "second"
    assert storage.budget_of(_id(announce_key("home", "p")), "q") == SHARED  # not p's own subkey
    assert storage.budget_of(_id(announce_key("elsewhere", "p")), "p") == SHARED
    for i in range(MAX_HOME_RECORDS):  # announcements of distinct peers: one record per key
        assert storage.store_subkey(_id(announce_key("home", f"p{i}")), f"p{i}", b"v", expiration)
    assert not storage.store_subkey(_id(announce_key("home", "late")), "late", b"v", expiration)
    assert storage.store_subkey(_id(announce_key("second", "late")), "late", b"v", expiration)
    assert storage.store_subkey(_id(announce_key("home", "p0")), "p0", b"newer", expiration + 1)  # an update


def _dictionary(records: int, value_bytes: int = MAX_RECORD_BYTES) -> bytes:
    """hivemind's encoding of one key's whole dictionary (what rpc_store and call_find carry)."""
    whole = DictionaryDHTValue()
    for i in range(records):
        whole.store(f"{i:0{MAX_PEER_ID_BYTES}d}", msgpack.packb(bytes(value_bytes)), get_dht_time() + 600 + i)
    return MSGPackSerializer.dumps(whole)


def test_the_largest_dictionary_a_node_can_answer_decodes_and_one_past_the_bounds_does_not():
    largest = _dictionary(MAX_SUBKEYS_PER_KEY)
    assert len(largest) <= MAX_DECODE_BYTES
    assert len(list(BoundedSerializer.loads(largest).items())) == MAX_SUBKEYS_PER_KEY
    with pytest.raises(DecodeRefused):
        BoundedSerializer.loads(_dictionary(MAX_SUBKEYS_PER_KEY + 1, value_bytes=8))  # objects, not bytes


@pytest.mark.parametrize(
    "payload",
    [
        msgpack_bomb(1_900_000),  # what the outside attacker sent: +139 MiB on hivemind's own decoder
        msgpack_bomb(MAX_DECODE_BYTES - 5),  # under the byte bound: the object budget stops it
        b"\x91" * 8 + b"\x90",  # arrays nested deeper than any dictionary
        b"\xd5\x50" + b"\x91\x91",  # a dictionary ext whose payload is cut short
        b"\x90\x90",  # a second value after the first
        b"\xc1",  # not msgpack
    ],
)
def test_costly_or_malformed_msgpack_is_refused_before_it_is_decoded(payload):
    started = time.perf_counter()
    with pytest.raises(DecodeRefused):
        BoundedSerializer.loads(payload)
    assert time.perf_counter() - started < 0.01
