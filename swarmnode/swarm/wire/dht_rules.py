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
what the rule compares. The rule is the same at every node, whatever its swarm: a reader drops a whole
dictionary when one of its subkeys fails the rule, so a record one node keeps must pass at every other.

Identity work is a storing node's own admission rule on top (``swarm.net.dht_guard``), since d is a swarm
setting: ``record_work`` reads what a kept record's signer proves (one hash), and the node ranks records by
it against its own d. Pure: no hivemind import; the test vectors in ``protocol/vectors`` check both.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgpack

from swarmnode.swarm.wire.codec import decode_message
from swarmnode.swarm.wire.limits import (
    MAX_CLOCK_SKEW_S,
    MAX_PEER_ID_BYTES,
    MAX_RECORD_BYTES,
    ROSTER_CARD,
    WORK_NONCE_FIELD,
    ProtocolError,
    validate_swarm_id,
)
from swarmnode.swarm.wire.protocol import BatchAnnouncement, RosterCard
from swarmnode.swarm.wire.work import NONCE_BYTES, PUBLIC_KEY_BYTES, leading_zero_bits, work_digest

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
# How a storing node ranks a record it keeps by its signer's identity work (``work_verdict``)
WITH_WORK, WITHOUT_WORK, NO_IDENTITY_WORK = "with_work", "without_work", "no_identity_work"


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


@dataclass(frozen=True)
class RecordWork:
    """What a storing node reads of a record ``check_record`` kept: whether it is a card, its swarm, and the
    identity work its signer proves (the leading zero bits of ``work.work_digest`` of the envelope's key
    and the body's ``work_nonce``; 0 without a nonce)."""

    is_card: bool
    swarm_id: str
    work_bits: int


def record_work(value: bytes) -> RecordWork | None:
    """The ``RecordWork`` of a stored value (hivemind's encoding: the record msgpack-packed as bin); None
    when it is not a message (never, for a value ``check_record`` kept). Reads the envelope without checking
    its signature again: only for records the validator kept (hivemind validates every record before it
    stores it), whose key the validator has tied to the subkey. About 10 µs: a decode of at most
    ``MAX_RECORD_BYTES`` and one sha256."""
    try:
        data = _unpack_record(value)
        envelope = _unpack_record(data) if type(data) is bytes else None
    except Exception:  # noqa: BLE001 - any msgpack failure: not a record
        return None
    body = envelope.get("b") if type(envelope) is dict else None
    if type(body) is not dict or type(body.get("swarm_id")) is not str:
        return None
    key, nonce = envelope.get("k"), body.get(WORK_NONCE_FIELD)
    proven = 0
    if (
        type(key) is bytes
        and len(key) == PUBLIC_KEY_BYTES
        and type(nonce) is bytes
        and len(nonce) == NONCE_BYTES
    ):
        proven = leading_zero_bits(work_digest(key, nonce))
    return RecordWork(is_card=envelope.get("t") == ROSTER_CARD, swarm_id=body["swarm_id"], work_bits=proven)


def work_verdict(work: RecordWork, bits: int, *, home: bool) -> str:
    """How a storing node that asks ``bits`` of identity work (its swarm's d) ranks a record it keeps:
    ``WITH_WORK`` when the signer proves ``bits``; otherwise ``NO_IDENTITY_WORK`` (refused) for a card of
    the node's own swarm (``home``: every reader of that swarm refuses it too), else ``WITHOUT_WORK``. The
    storage also counts an announcement without work as with work when it holds the signer's card with
    work (state: not this function's)."""
    if work.work_bits >= bits:
        return WITH_WORK
    return NO_IDENTITY_WORK if work.is_card and home else WITHOUT_WORK


def _unpack_record(data: bytes) -> object:
    """msgpack of at most a record's size: no str, bin or container can be larger than the input."""
    return msgpack.unpackb(
        data, raw=False, max_str_len=MAX_RECORD_BYTES, max_bin_len=MAX_RECORD_BYTES,
        max_array_len=MAX_RECORD_BYTES, max_map_len=MAX_RECORD_BYTES, max_ext_len=0,
    )  # fmt: skip


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
