"""DHT records no peer can forge, pin or drown: the rule every node applies where records are stored.

hivemind's ``rpc_store`` accepts any key, subkey, value and expiration from anyone, and for one
(key, subkey) the later expiration wins. Every swarmnode DHT node therefore installs a record
validator (``swarm.net.dht_guard``) that calls ``check_record`` on each record it is asked to store and on
each one a lookup brings back. A record is kept only when (PROTOCOL.md section 8):

1. it has a subkey (a plain value at a key would replace the whole dictionary there);
2. its value is at most ``MAX_RECORD_BYTES`` (plus msgpack's bin header) and is one signed RosterCard or
   BatchAnnouncement that decodes under the v1 rules (any swarm);
3. the subkey is the signer's peer id (``wrong_sender``): only a peer writes its own subkey;
4. the key is the one the message names: ``roster_key(swarm, signer)`` for a card,
   ``announce_key(swarm, signer)`` for an announcement (``wrong_key``);
5. its signed timestamp is not ahead of the storing node's clock by more than ``MAX_CLOCK_SKEW_S``
   (``stale``), and its expiration is at most timestamp + ``MAX_RECORD_TTL_S`` +
   ``RECORD_CLOCK_TOLERANCE_S`` for a card, timestamp + ``ANNOUNCE_RECORD_TTL_S`` for an announcement
   (``far_expiration``): nobody can pin a record (its own or, replayed, another peer's) past its natural
   lifetime. Authors store each record for the longest lifetime allowed (an announcement exactly until
   timestamp + ``ANNOUNCE_RECORD_TTL_S``, ``put_announcement``), so for one subkey, where the later
   expiration wins, a peer's newest record always outlives its older ones: a replay cannot win.

hivemind compares keys by their DHT id (sha1 of the msgpack-encoded key string: ``key_id``), so that is
what the rule compares. Pure: no hivemind import; the test vectors in ``protocol/vectors`` check it.
"""

from __future__ import annotations

import hashlib

import msgpack

from swarmnode.swarm.wire.codec import decode_message
from swarmnode.swarm.wire.limits import (
    MAX_CLOCK_SKEW_S,
    MAX_PEER_ID_BYTES,
    MAX_RECORD_BYTES,
    ProtocolError,
    validate_swarm_id,
)
from swarmnode.swarm.wire.protocol import BatchAnnouncement, RosterCard

# DHT layout and record limits (PROTOCOL.md section 8)
MAX_RECORD_TTL_S = 900.0  # a card expires <= its signed timestamp + this + RECORD_CLOCK_TOLERANCE_S
RECORD_CLOCK_TOLERANCE_S = 3.0  # hivemind's MAX_DHT_TIME_DISCREPANCY_SECONDS
# An announcement expires <= its signed timestamp + this, and its author stores it exactly until then (no
# tolerance: the bound is a function of the signed bytes, so a newer announcement's expiration is always
# later). 450 s is the longest record lifetime a reader judges freshness by (MAX_RECORD_TTL_S / 2); the 3 s
# more take older authors' put-time expirations (put time + at most 450 s).
ANNOUNCE_RECORD_TTL_S = MAX_RECORD_TTL_S / 2 + RECORD_CLOCK_TOLERANCE_S
ROSTER_SHARDS = 8  # roster keys per swarm (roster_key)
MAX_SUBKEYS_PER_KEY = 64  # subkeys one DHT key holds: 64 x 8 KiB stays far under hivemind's 4 MiB answer
ROSTER_TTL_PERIODS = 2  # roster DHT entries expire after 2 announce periods
ANNOUNCE_TTL_ROUNDS = 3  # announcements expire after 3 round durations
MSGPACK_BIN_HEADER_BYTES = 5  # hivemind stores our value msgpack-encoded: bin 32 header + the bytes
# hivemind's reserved subkeys: a plain value (msgpack nil) and a whole dictionary (empty bytes)
RESERVED_SUBKEYS = (msgpack.packb(None), b"")
RECORD_REJECT_REASONS = ("no_subkey", "oversize", "malformed", "wrong_key", "far_expiration")


def key_id(key: str) -> bytes:
    """hivemind's DHT id of a key string: ``DHTID.generate(source=key).to_bytes()``."""
    return hashlib.sha1(msgpack.packb(key, use_bin_type=True)).digest()


def check_record(key: bytes, subkey: bytes, value: bytes, expiration: float, now: float) -> str | None:
    """None if a node may keep this stored DHT record (hivemind's encoding: ``key`` is the DHT id,
    ``subkey`` and ``value`` msgpack-encoded); otherwise the reason: one of RECORD_REJECT_REASONS or a
    ``ProtocolError`` reason from decoding the value."""
    if subkey in RESERVED_SUBKEYS:
        return "no_subkey"
    if len(value) > MAX_RECORD_BYTES + MSGPACK_BIN_HEADER_BYTES or len(subkey) > MAX_PEER_ID_BYTES + 2:
        return "oversize"
    try:
        # a str subkey and a bin value: no container or ext type may even be allocated
        peer = msgpack.unpackb(
            subkey, raw=False, max_str_len=MAX_PEER_ID_BYTES, max_bin_len=0,
            max_array_len=0, max_map_len=0, max_ext_len=0,
        )  # fmt: skip
        data = msgpack.unpackb(
            value,
            raw=False,
            max_bin_len=len(value),
            max_str_len=0,
            max_array_len=0,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception:  # noqa: BLE001 - any msgpack failure is a malformed record
        return "malformed"
    if type(peer) is not str or type(data) is not bytes:
        return "malformed"
    if len(data) > MAX_RECORD_BYTES:
        return "oversize"
    try:
        msg, _ = decode_message(data, swarm_id=None, expected_peer_id=peer)
    except ProtocolError as exc:
        return exc.reason
    if isinstance(msg, RosterCard):
        expected = roster_key(msg.swarm_id, peer)
    elif isinstance(msg, BatchAnnouncement):
        expected = announce_key(msg.swarm_id, peer)
    else:
        return "wrong_key"  # a rollout batch never belongs in the DHT
    if key_id(expected) != key:
        return "wrong_key"
    if msg.timestamp > now + MAX_CLOCK_SKEW_S:
        return "stale"
    if expiration > record_expiration(msg):
        return "far_expiration"
    return None


def record_expiration(msg: RosterCard | BatchAnnouncement) -> float:
    """The latest expiration a storing node accepts for ``msg``'s DHT record (``far_expiration`` past it);
    an announcement's author stores it exactly until then."""
    if isinstance(msg, BatchAnnouncement):
        return msg.timestamp + ANNOUNCE_RECORD_TTL_S
    return msg.timestamp + MAX_RECORD_TTL_S + RECORD_CLOCK_TOLERANCE_S


def roster_shard(peer_id: str) -> int:
    """Which of the ``ROSTER_SHARDS`` roster keys holds ``peer_id``'s card: sha256(peer id)[0] mod shards."""
    return hashlib.sha256(peer_id.encode("utf-8", "surrogatepass")).digest()[0] % ROSTER_SHARDS


def roster_key(swarm_id: str, peer_id: str) -> str:
    """DHT key of the roster shard holding ``peer_id``'s card; subkey = peer id, value = encoded RosterCard.
    Sharded so that no one key's answer nears hivemind's 4 MiB response cap (``MAX_SUBKEYS_PER_KEY`` x
    ``MAX_RECORD_BYTES`` per shard) and one bad subkey costs a reader at most one shard."""
    return f"swarmnode/{validate_swarm_id(swarm_id)}/roster/{roster_shard(peer_id)}"


def roster_keys(swarm_id: str) -> list[str]:
    """Every roster shard key of the swarm (what a reader gets)."""
    return [f"swarmnode/{validate_swarm_id(swarm_id)}/roster/{shard}" for shard in range(ROSTER_SHARDS)]


def announce_key(swarm_id: str, peer_id: str) -> str:
    """DHT key of ``peer_id``'s announcements: subkey = peer id, value = that peer's latest encoded
    BatchAnnouncement. One key per peer, for all rounds: peers run at their own pace (and restart), so a
    reader takes every peer's newest batch whatever its round number, and no other peer's subkeys can
    make a reader lose it (hivemind drops a whole dictionary when one subkey fails validation)."""
    return f"swarmnode/{validate_swarm_id(swarm_id)}/announce/{peer_id}"


def roster_ttl_s(announce_period_s: float) -> float:
    return ROSTER_TTL_PERIODS * announce_period_s


def announce_ttl_s(round_period_s: float) -> float:
    return ANNOUNCE_TTL_ROUNDS * round_period_s
