"""Canonical msgpack and signed envelopes: ``encode_message`` / ``decode_message``.

The wire types are ``wire.protocol``, their limits ``wire.limits`` (spec: ``protocol/PROTOCOL.md``); this
module turns them into bytes and back. ``decode_message`` checks, cheapest first: size, msgpack with hard
limits, envelope shape, version, canonical form, signature, peer id == key, expected sender, swarm, then
every field (``wire.reader``). It raises ``ProtocolError`` with a ``reason`` from ``REJECT_REASONS`` and
nothing else, whatever the input.
"""

from __future__ import annotations

from typing import Any

import msgpack

from swarmnode.identity import Identity, peer_id_from_public_key, verify_signature
from swarmnode.swarm.wire.limits import (
    DOMAIN_PREFIX,
    MAX_FRAME_BYTES,
    MAX_NESTING,
    PROTOCOL_VERSION,
    ROLLOUT_BATCH,
    UNPACK_MAX_ARRAY_LEN,
    UNPACK_MAX_BIN_LEN,
    UNPACK_MAX_CONTAINERS,
    UNPACK_MAX_MAP_LEN,
    UNPACK_MAX_STR_LEN,
    ProtocolError,
    payload_digest,
)
from swarmnode.swarm.wire.protocol import MESSAGE_CLASSES, BatchAnnouncement, Message, RolloutBatch
from swarmnode.swarm.wire.reader import Reader

_ENVELOPE_KEYS = frozenset("bkstv")


def canonical_packb(obj: Any) -> bytes:
    """The canonical msgpack encoding (PROTOCOL.md): map keys are strings sorted by their UTF-8 bytes,
    str/bin types distinct, shortest length and integer forms, every float as float64, no ext types."""
    try:
        return msgpack.packb(_canonical(obj, 1), use_bin_type=True)
    except (UnicodeEncodeError, OverflowError, ValueError, TypeError) as e:  # lone surrogates, huge ints
        raise ProtocolError("bad_field", f"not encodable: {e}"[:200]) from None


def signing_bytes(msg_type: str, swarm_id: str, body_bytes: bytes) -> bytes:
    """The bytes an envelope's signature covers (domain-separated by version, type and swarm)."""
    return DOMAIN_PREFIX + msg_type.encode() + b"\x00" + swarm_id.encode() + b"\x00" + body_bytes


def pack_envelope(
    msg_type: str, body_bytes: bytes, public_key: bytes, signature: bytes, version: int = 1
) -> bytes:
    """Canonical envelope around an already canonical body: the map {b, k, s, t, v} in that key order."""
    rest = msgpack.packb(
        {"k": bytes(public_key), "s": bytes(signature), "t": msg_type, "v": version}, use_bin_type=True
    )
    return b"\x85\xa1b" + body_bytes + rest[1:]  # fixmap of 5, "b", body, then k s t v (minus 0x84 header)


def encode_message(identity: Identity, swarm_id: str, msg: Message) -> bytes:
    """Validate, sign and encode ``msg``. Raises ProtocolError if peers would reject it (same checks)."""
    cls = type(msg)
    if cls not in MESSAGE_CLASSES.values():
        raise TypeError(f"not a wire message: {cls.__name__}")
    if msg.peer_id != identity.peer_id:
        raise ValueError(
            f"message peer_id {msg.peer_id!r} is not the signing identity's {identity.peer_id!r}"
        )
    if msg.swarm_id != swarm_id:
        raise ValueError(f"message swarm_id {msg.swarm_id!r} differs from {swarm_id!r}")
    body = msg.to_body()
    cls.from_body(Reader(body, ""))  # exactly the receiver's field checks
    body_bytes = canonical_packb(body)
    signature = identity.sign(signing_bytes(cls.TYPE, swarm_id, body_bytes))
    data = pack_envelope(cls.TYPE, body_bytes, identity.public_key, signature)
    if len(data) > cls.MAX_BYTES:
        raise ProtocolError("oversize", f"{cls.TYPE} is {len(data)} bytes; the limit is {cls.MAX_BYTES}")
    return data


def decode_message(
    data: bytes,
    *,
    swarm_id: str | None,
    expected_type: str | None = None,
    expected_peer_id: str | None = None,
) -> tuple[Message, str]:
    """Check and decode one envelope; returns (message, sender peer id). Raises only ProtocolError.

    ``expected_peer_id``: the peer the bytes must come from (the stream's authenticated remote peer,
    or the DHT subkey they were stored under). ``swarm_id=None`` accepts any swarm (the DHT record
    validator: a node stores records for every swarm whose keys are near it).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError("decode_message takes bytes")
    if expected_type is not None and expected_type not in MESSAGE_CLASSES:
        raise ValueError(f"unknown expected_type {expected_type!r}")
    data = bytes(data)
    cap = MESSAGE_CLASSES[expected_type].MAX_BYTES if expected_type else MAX_FRAME_BYTES
    if len(data) > cap:
        raise ProtocolError("oversize", f"{len(data)} bytes; the limit is {cap}")
    envelope = _unpack(data)

    if not isinstance(envelope, dict) or type(envelope.get("v")) is not int:
        raise ProtocolError("malformed", "not an envelope (a map with an integer 'v')")
    if envelope["v"] != PROTOCOL_VERSION:
        raise ProtocolError("bad_version", f"version {envelope['v']}; this node speaks {PROTOCOL_VERSION}")
    if envelope.keys() != _ENVELOPE_KEYS:
        raise ProtocolError(
            "malformed", f"envelope keys {sorted(envelope)}; expected {sorted(_ENVELOPE_KEYS)}"
        )
    msg_type, body, key, signature = envelope["t"], envelope["b"], envelope["k"], envelope["s"]
    if not (isinstance(msg_type, str) and isinstance(body, dict)):
        raise ProtocolError("malformed", "envelope 't' must be a string and 'b' a map")
    if not (
        isinstance(key, bytes) and len(key) == 32 and isinstance(signature, bytes) and len(signature) == 64
    ):
        raise ProtocolError("malformed", "envelope 'k' must be 32 bytes and 's' 64 bytes")
    cls = MESSAGE_CLASSES.get(msg_type)
    if cls is None:
        raise ProtocolError("unknown_type", repr(msg_type[:64]))
    if expected_type is not None and msg_type != expected_type:
        raise ProtocolError("wrong_type", f"got {msg_type}, expected {expected_type}")
    if len(data) > cls.MAX_BYTES:
        raise ProtocolError("oversize", f"{msg_type} is {len(data)} bytes; the limit is {cls.MAX_BYTES}")

    body_bytes = canonical_packb(body)
    if pack_envelope(msg_type, body_bytes, key, signature) != data:
        raise ProtocolError("non_canonical", "bytes are not the canonical encoding")

    r = Reader(body, "")
    claimed_swarm = r.swarm_id()
    if not verify_signature(key, signature, signing_bytes(msg_type, claimed_swarm, body_bytes)):
        raise ProtocolError("bad_signature")
    sender = peer_id_from_public_key(key)
    if r.peer_id() != sender:
        raise ProtocolError("peer_id_mismatch", f"body peer_id is not {sender}")
    if expected_peer_id is not None and sender != expected_peer_id:
        raise ProtocolError("wrong_sender", f"signed by {sender}, expected {expected_peer_id}")
    if swarm_id is not None and claimed_swarm != swarm_id:
        raise ProtocolError("wrong_swarm", f"swarm {claimed_swarm!r}, this node is in {swarm_id!r}")
    return cls.from_body(r), sender


def _unpack(data: bytes) -> Any:
    containers = 0

    def count(obj: Any) -> Any:
        nonlocal containers
        containers += 1
        if containers > UNPACK_MAX_CONTAINERS:
            raise ValueError(f"more than {UNPACK_MAX_CONTAINERS} arrays and maps")
        return obj

    def pairs(items: list[tuple[Any, Any]]) -> dict[Any, Any]:
        count(items)
        out = dict(items)
        if len(out) != len(items):
            raise ValueError("duplicate map key")
        return out

    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            list_hook=count,
            object_pairs_hook=pairs,
            max_str_len=UNPACK_MAX_STR_LEN,
            max_bin_len=UNPACK_MAX_BIN_LEN,
            max_array_len=UNPACK_MAX_ARRAY_LEN,
            max_map_len=UNPACK_MAX_MAP_LEN,
            max_ext_len=0,
        )
    except Exception as e:  # noqa: BLE001 - msgpack raises ValueError subclasses, TypeError, ...
        raise ProtocolError("malformed", f"{type(e).__name__}: {e}"[:200]) from None


def _canonical(obj: Any, depth: int) -> Any:
    """A copy with map keys sorted and tuples as lists; refuses what v1 bodies cannot hold."""
    if depth > MAX_NESTING:
        raise ProtocolError("malformed", f"nested deeper than {MAX_NESTING}")
    if obj is None or isinstance(obj, bool | str | bytes):
        return obj
    if isinstance(obj, int):
        if not -(2**63) <= obj < 2**64:
            raise ProtocolError("bad_field", "integer outside the msgpack range")
        return obj
    if isinstance(obj, float):
        return obj
    if isinstance(obj, list | tuple):
        return [_canonical(v, depth + 1) for v in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise ProtocolError("malformed", "map keys must be strings")
        return {
            k: _canonical(obj[k], depth + 1)
            for k in sorted(obj, key=lambda k: k.encode("utf-8", "surrogatepass"))
        }
    raise ProtocolError("malformed", f"{type(obj).__name__} is not a v1 wire value")


def check_payload(announcement: BatchAnnouncement, data: bytes, *, swarm_id: str) -> RolloutBatch:
    """Check pulled bytes against a (decoded, verified) announcement, then decode them as its batch."""
    if len(data) != announcement.payload_len or payload_digest(data) != announcement.payload_sha256:
        raise ProtocolError("hash_mismatch", f"{len(data)} bytes do not match the announced payload")
    batch, _ = decode_message(
        data, swarm_id=swarm_id, expected_type=ROLLOUT_BATCH, expected_peer_id=announcement.peer_id
    )
    assert isinstance(batch, RolloutBatch)
    for name in ("round", "policy_version"):
        if getattr(batch, name) != getattr(announcement, name):
            raise ProtocolError("bad_field", f"batch {name} differs from its announcement")
    if len(batch.groups) != announcement.n_groups:
        raise ProtocolError("bad_field", "batch group count differs from its announcement")
    return batch
