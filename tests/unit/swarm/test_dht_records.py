"""The node's side of the DHT records (swarm.net.dht, wire.dht_rules): requests to the DHT process stay
small whatever the roster, and an announcement's storing rule is one a replay cannot win (issue #26)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import pickle

import msgpack

from swarmnode.identity import Identity
from swarmnode.swarm.net import dht
from swarmnode.swarm.wire import codec, dht_rules, protocol
from swarmnode.swarm.wire.limits import MAX_PEER_ID_BYTES, MAX_SWARM_ID_BYTES

SWARM = "s" * MAX_SWARM_ID_BYTES  # the longest keys
NOW = 1_767_225_600.0
PIPE_ONE_WRITE_BYTES = 16 * 1024  # Python's Connection.send writes a larger message in two writes


def _done(value) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(value)
    return future


class FakeDHT:
    """Records what DHTRecords sends to hivemind's DHT process (the pickled request, as hivemind sends it)."""

    def __init__(self):
        self.requests: list[bytes] = []
        self.stores: list[dict] = []

    def run_coroutine(self, coroutine, return_future=False):
        self.requests.append(pickle.dumps(("_run_coroutine", [], {"coro": coroutine})))
        return _done({key: {} for key in coroutine.keywords["keys"]})

    def store(self, key, value, expiration_time, subkey, return_future=False):
        self.stores.append(dict(key=key, value=value, expiration=expiration_time, subkey=subkey))
        return _done(True)


def _records(fake: FakeDHT) -> dht.DHTRecords:
    return dht.DHTRecords(lambda: fake, record_timeout_s=5.0)


def _announcement(identity: Identity, timestamp: float) -> bytes:
    body = protocol.BatchAnnouncement(
        peer_id=identity.peer_id, swarm_id=SWARM, round=1, policy_version=0, payload_sha256=bytes(32),
        payload_len=100, n_groups=1, timestamp=timestamp, seq=1,
    )  # fmt: skip
    return codec.encode_message(identity, SWARM, body)


def test_a_read_of_512_announcement_keys_goes_to_the_dht_process_in_small_requests():
    fake = FakeDHT()
    peers = ["1" * MAX_PEER_ID_BYTES] + [
        f"12D3KooW{hashlib.sha256(b'%d' % i).hexdigest()}" for i in range(511)
    ]
    found = dht.read_announcements(_records(fake), SWARM, peers, 5.0)
    assert found == []
    assert len(fake.requests) == -(-512 // dht.KEYS_PER_REQUEST)
    largest = max(len(request) for request in fake.requests)
    assert largest < PIPE_ONE_WRITE_BYTES // 2, largest  # one write, with room to spare


def test_an_announcement_is_stored_until_exactly_the_latest_expiration_storing_nodes_accept():
    author, fake = Identity.generate(), FakeDHT()
    record = _announcement(author, NOW)
    assert dht.put_announcement(_records(fake), SWARM, author.peer_id, record, None)
    (stored,) = fake.stores
    assert stored["expiration"] == NOW + dht_rules.ANNOUNCE_RECORD_TTL_S
    check = lambda expiration: dht_rules.check_record(  # noqa: E731 - hivemind's encoding, as stored
        dht_rules.key_id(stored["key"]), msgpack.packb(author.peer_id), msgpack.packb(record), expiration, NOW
    )
    assert check(stored["expiration"]) is None
    assert check(stored["expiration"] + 0.001) == "far_expiration"


def test_no_expiration_an_older_announcement_may_have_reaches_a_newer_ones():
    """The replay measured in #26 (timestamp + 902 s) is refused, and the latest expiration allowed is
    later for every newer announcement: for one subkey the later expiration wins, so the newest stays."""
    author = Identity.generate()
    old, new = _announcement(author, NOW - 1.0), _announcement(author, NOW)
    key, subkey = (
        dht_rules.key_id(dht_rules.announce_key(SWARM, author.peer_id)),
        msgpack.packb(author.peer_id),
    )
    replay = NOW - 1.0 + dht_rules.MAX_RECORD_TTL_S + 2.0
    assert dht_rules.check_record(key, subkey, msgpack.packb(old), replay, NOW) == "far_expiration"
    latest_old = NOW - 1.0 + dht_rules.ANNOUNCE_RECORD_TTL_S
    assert dht_rules.check_record(key, subkey, msgpack.packb(old), latest_old, NOW) is None
    assert dht_rules.check_record(key, subkey, msgpack.packb(new), latest_old + 1.0, NOW) is None
    # cards keep their rule (their author stores them for MAX_RECORD_TTL_S from the put)
    assert dht_rules.ANNOUNCE_RECORD_TTL_S < dht_rules.MAX_RECORD_TTL_S
