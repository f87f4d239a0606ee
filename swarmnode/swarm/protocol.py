"""The wire protocol, version 1: the one module with the wire types. ``protocol/PROTOCOL.md`` is the spec.

Three signed messages travel between nodes: a ``RosterCard`` ("I am here, this model, these addresses";
a DHT record), a ``BatchAnnouncement`` ("I have a rollout batch for round r with this sha256"; a DHT
record) and the ``RolloutBatch`` itself (pulled over a libp2p stream, framed by this module).

Every message is a canonical msgpack envelope ``{"b": body, "k": public key, "s": signature, "t": type,
"v": 1}`` signed with the sender's Ed25519 identity (the key of its libp2p peer id). ``decode_message``
checks, cheapest first: size, msgpack with hard limits, envelope shape, version, canonical form,
signature, peer id == key, expected sender, swarm, then every field. It raises ``ProtocolError`` with a
``reason`` from ``REJECT_REASONS`` and nothing else, whatever the input. State-dependent checks
(timestamp window, per-sender sequence numbers, payload hash vs announcement) belong to the caller;
``check_fresh`` and ``check_payload`` are the pure parts of them.

A batch carries task references, completions and *claimed* rewards only: no question, no answer. The
receiver regenerates both from the ``TaskRef`` and recomputes rewards itself (``received_groups``).
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

from swarmnode.identity import Identity, peer_id_from_public_key, verify_signature
from swarmnode.rollouts import Completion, Provenance, RolloutGroup, TaskRef

PROTOCOL_VERSION = 1
DOMAIN_PREFIX = b"swarmnode/v1/"  # signed bytes = prefix + type + 0x00 + swarm_id + 0x00 + canonical body

ROSTER_CARD = "roster_card"
BATCH_ANNOUNCEMENT = "batch_announcement"
ROLLOUT_BATCH = "rollout_batch"
MESSAGE_TYPES = (ROSTER_CARD, BATCH_ANNOUNCEMENT, ROLLOUT_BATCH)

# --- size limits (bytes are encoded bytes; string lengths are UTF-8 bytes) -----------------------------
MAX_FRAME_BYTES = 4 * 1024 * 1024  # one encoded RolloutBatch, and one stream frame body
MAX_RECORD_BYTES = 8 * 1024  # one encoded RosterCard or BatchAnnouncement (a DHT value)
MAX_GROUPS_PER_BATCH = 64
MAX_COMPLETIONS_PER_GROUP = 64
MAX_COMPLETION_TEXT_BYTES = 16 * 1024
MAX_COMPLETION_TOKENS = 4096  # n_tokens, hence logprobs and token_ids per completion
MAX_PEER_ID_BYTES = 128
MAX_SWARM_ID_BYTES = 64
MAX_NAME_BYTES = 256  # model_name
MAX_FINGERPRINT_CHARS = 128  # tokenizer_fingerprint, lowercase hex
MAX_ADDRS = 16
MAX_ADDR_BYTES = 256
MAX_DATASET_BYTES = 128
MAX_CONFIG_ENTRIES = 32  # per map inside a task config
MAX_CONFIG_LIST = 64  # per list inside a task config
MAX_CONFIG_KEY_BYTES = 64
MAX_CONFIG_STR_BYTES = 256
MAX_CONFIG_DEPTH = 4  # the config map itself is depth 1

# --- hard decoder limits: anything beyond them is "malformed" before any field is looked at ---------
UNPACK_MAX_STR_LEN = MAX_COMPLETION_TEXT_BYTES
UNPACK_MAX_BIN_LEN = 4 * MAX_COMPLETION_TOKENS
UNPACK_MAX_ARRAY_LEN = 1024
UNPACK_MAX_MAP_LEN = 256
UNPACK_MAX_CONTAINERS = 16384  # arrays + maps in one message (bounds memory per decoded byte)
MAX_NESTING = 16  # depth of arrays/maps in a body, the body map being depth 1

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# --- checks that need state (done by the caller; documented in PROTOCOL.md) -----------------------
MAX_CLOCK_SKEW_S = 30.0  # |timestamp - receiver clock| must be <= this
ROSTER_TTL_PERIODS = 2  # roster DHT entries expire after 2 announce periods
ANNOUNCE_TTL_ROUNDS = 3  # announcements expire after 3 round durations

# --- payload pulls over a libp2p stream ----------------------------------------------------------
PAYLOAD_STREAM = "/swarmnode/v1/payload"  # hivemind add_binary_stream_handler name
PULL_REQUEST_BYTES = 32  # the request is the payload's sha256
FRAME_HEADER_BYTES = 4  # response: big-endian uint32 length, then the body; length 0 = "not here"

REJECT_REASONS = (
    # raised by decode_message (in the order it checks)
    "oversize",  # encoded size over the cap for its kind, or a frame header over MAX_FRAME_BYTES
    "malformed",  # not msgpack, truncated, trailing bytes, hard limits, bad envelope shape
    "bad_version",  # envelope version is not PROTOCOL_VERSION
    "unknown_type",  # message type not in MESSAGE_TYPES
    "wrong_type",  # a known type, but not the one expected here
    "non_canonical",  # valid msgpack, but not the canonical encoding of what it holds
    "bad_signature",  # signature does not verify against the embedded key (or the key is weak)
    "peer_id_mismatch",  # body.peer_id is not the peer id of the embedded key
    "wrong_sender",  # signed by another peer than the one the caller expected (stream peer, DHT subkey)
    "wrong_swarm",  # body.swarm_id is not the receiver's swarm
    "missing_field",  # a required field is absent
    "bad_field",  # wrong type, out of range, bad format, inconsistent lengths
    "over_limit",  # a per-field count or length limit exceeded (groups, completions, text, ...)
    # raised by the stateful checks around the decoder
    "stale",  # timestamp outside +-MAX_CLOCK_SKEW_S of the receiver's clock
    "replay",  # seq not strictly greater than the last seen from this sender for this type
    "hash_mismatch",  # pulled payload's length/sha256 differ from the announcement
)

_SWARM_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_FINGERPRINT_RE = re.compile(r"[0-9a-f]*")
_DATASET_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
_ADDR_RE = re.compile(r"/[\x21-\x7e]*")
_NO_CONTROL_RE = re.compile(r"[^\x00-\x1f\x7f]*")
_ENVELOPE_KEYS = frozenset("bkstv")


class ProtocolError(Exception):
    """A message was rejected; ``reason`` is one of ``REJECT_REASONS`` (a metrics label)."""

    def __init__(self, reason: str, detail: str = ""):
        if reason not in REJECT_REASONS:
            raise ValueError(f"unknown reject reason {reason!r}")
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


# ============================================================================================
# Wire types
# ============================================================================================


@dataclass(frozen=True)
class WireTask:
    """A task reference on the wire: the receiver regenerates question and answer from it."""

    dataset: str
    config: Mapping[str, Any]
    seed: int
    index: int
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False)

    def to_body(self) -> dict[str, Any]:
        return _with_extra(
            {"dataset": self.dataset, "config": _plain(self.config), "seed": self.seed, "index": self.index},
            self.extra,
        )

    @classmethod
    def from_body(cls, r: _Reader) -> WireTask:
        return cls(
            dataset=r.str("dataset", MAX_DATASET_BYTES, _DATASET_RE, min_bytes=1),
            config=r.config("config"),
            seed=r.int("seed", INT64_MIN, INT64_MAX),
            index=r.int("index", 0, INT64_MAX),
            extra=r.extra(),
        )


@dataclass(frozen=True)
class WireCompletion:
    """One completion: text, token count in the producer's tokenizer, and optionally the producer's
    token ids (uint32) and per-token behaviour log-probs (float32), each exactly n_tokens long."""

    text: str
    n_tokens: int
    finished: bool = True
    logprobs: tuple[float, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False)

    def to_body(self) -> dict[str, Any]:
        return _with_extra(
            {
                "text": self.text,
                "n_tokens": self.n_tokens,
                "finished": self.finished,
                "logprobs": None if self.logprobs is None else _pack_array("f", self.logprobs, "logprobs"),
                "token_ids": None
                if self.token_ids is None
                else _pack_array("I", self.token_ids, "token_ids"),
            },
            self.extra,
        )

    @classmethod
    def from_body(cls, r: _Reader) -> WireCompletion:
        text = r.str("text", MAX_COMPLETION_TEXT_BYTES)
        n_tokens = r.int("n_tokens", 0, MAX_COMPLETION_TOKENS, over_limit=True)
        finished = r.bool("finished")
        logprobs = r.packed("logprobs", "f", n_tokens)
        if logprobs is not None and not all(map(math.isfinite, logprobs)):
            raise ProtocolError("bad_field", f"{r.path}logprobs: not finite")
        return cls(
            text=text,
            n_tokens=n_tokens,
            finished=finished,
            logprobs=logprobs,
            token_ids=r.packed("token_ids", "I", n_tokens),
            extra=r.extra(),
        )


@dataclass(frozen=True)
class WireGroup:
    """Completions of one task, with the rewards the producer claims (never trusted)."""

    task: WireTask
    completions: tuple[WireCompletion, ...]
    claimed_rewards: tuple[float, ...]
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False)

    def to_body(self) -> dict[str, Any]:
        return _with_extra(
            {
                "task": self.task.to_body(),
                "completions": [c.to_body() for c in self.completions],
                "claimed_rewards": [float(x) for x in self.claimed_rewards],
            },
            self.extra,
        )

    @classmethod
    def from_body(cls, r: _Reader) -> WireGroup:
        task = WireTask.from_body(r.map("task"))
        completions = tuple(
            WireCompletion.from_body(c) for c in r.maps("completions", MAX_COMPLETIONS_PER_GROUP, min_len=1)
        )
        rewards = r.floats("claimed_rewards", MAX_COMPLETIONS_PER_GROUP)
        if len(rewards) != len(completions):
            raise ProtocolError(
                "bad_field", f"{r.path}claimed_rewards: {len(rewards)} for {len(completions)} completions"
            )
        return cls(task=task, completions=completions, claimed_rewards=rewards, extra=r.extra())


@dataclass(frozen=True)
class RosterCard:
    """A node's presence in the swarm (DHT: ``roster_key(swarm_id)``, subkey = peer id)."""

    TYPE: ClassVar[str] = ROSTER_CARD
    MAX_BYTES: ClassVar[int] = MAX_RECORD_BYTES

    peer_id: str
    swarm_id: str
    model_name: str
    tokenizer_fingerprint: str
    policy_version: int
    round: int
    addrs: tuple[str, ...]
    timestamp: float
    seq: int
    protocol_version: int = PROTOCOL_VERSION  # the highest protocol version the node speaks
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False)

    def to_body(self) -> dict[str, Any]:
        return _with_extra(
            {
                "peer_id": self.peer_id,
                "swarm_id": self.swarm_id,
                "protocol_version": self.protocol_version,
                "model_name": self.model_name,
                "tokenizer_fingerprint": self.tokenizer_fingerprint,
                "policy_version": self.policy_version,
                "round": self.round,
                "addrs": list(self.addrs),
                "timestamp": float(self.timestamp),
                "seq": self.seq,
            },
            self.extra,
        )

    @classmethod
    def from_body(cls, r: _Reader) -> RosterCard:
        return cls(
            peer_id=r.peer_id(),
            swarm_id=r.swarm_id(),
            protocol_version=r.int("protocol_version", 1, INT64_MAX),
            model_name=r.str("model_name", MAX_NAME_BYTES, _NO_CONTROL_RE, min_bytes=1),
            tokenizer_fingerprint=r.str("tokenizer_fingerprint", MAX_FINGERPRINT_CHARS, _FINGERPRINT_RE),
            policy_version=r.int("policy_version", 0, INT64_MAX),
            round=r.int("round", 0, INT64_MAX),
            addrs=r.strs("addrs", MAX_ADDRS, MAX_ADDR_BYTES, _ADDR_RE),
            timestamp=r.timestamp(),
            seq=r.int("seq", 0, INT64_MAX),
            extra=r.extra(),
        )


@dataclass(frozen=True)
class BatchAnnouncement:
    """ "I have a rollout batch for this round": DHT ``announce_key(swarm_id)``, subkey = peer id.
    Pull it from the announcer by ``payload_sha256`` (see ``PAYLOAD_STREAM``)."""

    TYPE: ClassVar[str] = BATCH_ANNOUNCEMENT
    MAX_BYTES: ClassVar[int] = MAX_RECORD_BYTES

    peer_id: str
    swarm_id: str
    round: int
    policy_version: int
    payload_sha256: bytes
    payload_len: int
    n_groups: int
    timestamp: float
    seq: int
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False)

    def to_body(self) -> dict[str, Any]:
        return _with_extra(
            {
                "peer_id": self.peer_id,
                "swarm_id": self.swarm_id,
                "round": self.round,
                "policy_version": self.policy_version,
                "payload_sha256": bytes(self.payload_sha256),
                "payload_len": self.payload_len,
                "n_groups": self.n_groups,
                "timestamp": float(self.timestamp),
                "seq": self.seq,
            },
            self.extra,
        )

    @classmethod
    def from_body(cls, r: _Reader) -> BatchAnnouncement:
        return cls(
            peer_id=r.peer_id(),
            swarm_id=r.swarm_id(),
            round=r.int("round", 0, INT64_MAX),
            policy_version=r.int("policy_version", 0, INT64_MAX),
            payload_sha256=r.bin("payload_sha256", 32),
            payload_len=r.int("payload_len", 1, MAX_FRAME_BYTES),
            n_groups=r.int("n_groups", 1, MAX_GROUPS_PER_BATCH),
            timestamp=r.timestamp(),
            seq=r.int("seq", 0, INT64_MAX),
            extra=r.extra(),
        )


@dataclass(frozen=True)
class RolloutBatch:
    """Question groups a node shares for one round (pulled over a stream, never put in the DHT)."""

    TYPE: ClassVar[str] = ROLLOUT_BATCH
    MAX_BYTES: ClassVar[int] = MAX_FRAME_BYTES

    peer_id: str
    swarm_id: str
    round: int
    policy_version: int
    model_name: str
    tokenizer_fingerprint: str
    timestamp: float
    seq: int
    groups: tuple[WireGroup, ...]
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False)

    def to_body(self) -> dict[str, Any]:
        return _with_extra(
            {
                "peer_id": self.peer_id,
                "swarm_id": self.swarm_id,
                "round": self.round,
                "policy_version": self.policy_version,
                "model_name": self.model_name,
                "tokenizer_fingerprint": self.tokenizer_fingerprint,
                "timestamp": float(self.timestamp),
                "seq": self.seq,
                "groups": [g.to_body() for g in self.groups],
            },
            self.extra,
        )

    @classmethod
    def from_body(cls, r: _Reader) -> RolloutBatch:
        return cls(
            peer_id=r.peer_id(),
            swarm_id=r.swarm_id(),
            round=r.int("round", 0, INT64_MAX),
            policy_version=r.int("policy_version", 0, INT64_MAX),
            model_name=r.str("model_name", MAX_NAME_BYTES, _NO_CONTROL_RE, min_bytes=1),
            tokenizer_fingerprint=r.str("tokenizer_fingerprint", MAX_FINGERPRINT_CHARS, _FINGERPRINT_RE),
            timestamp=r.timestamp(),
            seq=r.int("seq", 0, INT64_MAX),
            groups=tuple(WireGroup.from_body(g) for g in r.maps("groups", MAX_GROUPS_PER_BATCH, min_len=1)),
            extra=r.extra(),
        )


Message = RosterCard | BatchAnnouncement | RolloutBatch
_CLASSES: dict[str, type] = {c.TYPE: c for c in (RosterCard, BatchAnnouncement, RolloutBatch)}


# ============================================================================================
# Canonical encoding, signing, envelope
# ============================================================================================


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
    if cls not in _CLASSES.values():
        raise TypeError(f"not a wire message: {cls.__name__}")
    if msg.peer_id != identity.peer_id:
        raise ValueError(
            f"message peer_id {msg.peer_id!r} is not the signing identity's {identity.peer_id!r}"
        )
    if msg.swarm_id != swarm_id:
        raise ValueError(f"message swarm_id {msg.swarm_id!r} differs from {swarm_id!r}")
    body = msg.to_body()
    cls.from_body(_Reader(body, ""))  # exactly the receiver's field checks
    body_bytes = canonical_packb(body)
    signature = identity.sign(signing_bytes(cls.TYPE, swarm_id, body_bytes))
    data = pack_envelope(cls.TYPE, body_bytes, identity.public_key, signature)
    if len(data) > cls.MAX_BYTES:
        raise ProtocolError("oversize", f"{cls.TYPE} is {len(data)} bytes; the limit is {cls.MAX_BYTES}")
    return data


def decode_message(
    data: bytes,
    *,
    swarm_id: str,
    expected_type: str | None = None,
    expected_peer_id: str | None = None,
) -> tuple[Message, str]:
    """Check and decode one envelope; returns (message, sender peer id). Raises only ProtocolError.

    ``expected_peer_id``: the peer the bytes must come from (the stream's authenticated remote peer,
    or the DHT subkey they were stored under).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError("decode_message takes bytes")
    if expected_type is not None and expected_type not in _CLASSES:
        raise ValueError(f"unknown expected_type {expected_type!r}")
    data = bytes(data)
    cap = _CLASSES[expected_type].MAX_BYTES if expected_type else MAX_FRAME_BYTES
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
    cls = _CLASSES.get(msg_type)
    if cls is None:
        raise ProtocolError("unknown_type", repr(msg_type[:64]))
    if expected_type is not None and msg_type != expected_type:
        raise ProtocolError("wrong_type", f"got {msg_type}, expected {expected_type}")
    if len(data) > cls.MAX_BYTES:
        raise ProtocolError("oversize", f"{msg_type} is {len(data)} bytes; the limit is {cls.MAX_BYTES}")

    body_bytes = canonical_packb(body)
    if pack_envelope(msg_type, body_bytes, key, signature) != data:
        raise ProtocolError("non_canonical", "bytes are not the canonical encoding")

    r = _Reader(body, "")
    claimed_swarm = r.swarm_id()
    if not verify_signature(key, signature, signing_bytes(msg_type, claimed_swarm, body_bytes)):
        raise ProtocolError("bad_signature")
    sender = peer_id_from_public_key(key)
    if r.peer_id() != sender:
        raise ProtocolError("peer_id_mismatch", f"body peer_id is not {sender}")
    if expected_peer_id is not None and sender != expected_peer_id:
        raise ProtocolError("wrong_sender", f"signed by {sender}, expected {expected_peer_id}")
    if claimed_swarm != swarm_id:
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


def _with_extra(known: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    clash = known.keys() & extra.keys()
    if clash:
        raise ValueError(f"extra fields shadow known ones: {sorted(clash)}")
    return {**extra, **known}


def _plain(value: Any) -> Any:
    """Mappings -> dict, tuples -> list (TaskRef configs are frozen tuples)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _pack_array(code: str, values: Sequence[float | int], name: str) -> bytes:
    try:
        return struct.pack(f"<{len(values)}{code}", *values)
    except (struct.error, OverflowError, TypeError) as e:
        raise ProtocolError("bad_field", f"{name}: {e}") from None


# ============================================================================================
# Field checks
# ============================================================================================


class _Reader:
    """Typed access to one decoded map; every failure is a ProtocolError naming the field path."""

    def __init__(self, d: dict[str, Any], path: str):
        self.d, self.path, self.used = d, path, set()

    def take(self, name: str) -> Any:
        if name not in self.d:
            raise ProtocolError("missing_field", self.path + name)
        self.used.add(name)
        return self.d[name]

    def fail(self, name: str, what: str, reason: str = "bad_field") -> ProtocolError:
        return ProtocolError(reason, f"{self.path}{name}: {what}")

    def int(self, name: str, lo: int, hi: int, *, over_limit: bool = False) -> int:
        v = self.take(name)
        if type(v) is not int:
            raise self.fail(name, f"expected an integer, got {type(v).__name__}")
        if not lo <= v <= hi:
            reason = "over_limit" if over_limit and v > hi else "bad_field"
            raise self.fail(name, f"{v} outside [{lo}, {hi}]", reason)
        return v

    def bool(self, name: str) -> bool:
        v = self.take(name)
        if type(v) is not bool:
            raise self.fail(name, f"expected a boolean, got {type(v).__name__}")
        return v

    def timestamp(self) -> float:
        v = self.take("timestamp")
        if type(v) is not float or not math.isfinite(v) or v < 0:
            raise self.fail("timestamp", "expected finite non-negative float64 seconds")
        return v

    def str(self, name: str, max_bytes: int, pattern: re.Pattern | None = None, *, min_bytes: int = 0) -> str:
        return self._check_str(self.take(name), name, max_bytes, pattern, min_bytes)

    def _check_str(
        self, v: Any, name: str, max_bytes: int, pattern: re.Pattern | None, min_bytes: int
    ) -> str:
        if type(v) is not str:
            raise self.fail(name, f"expected a string, got {type(v).__name__}")
        n = _utf8_len(v, self.path + name)
        if n > max_bytes:
            raise self.fail(name, f"{n} bytes; the limit is {max_bytes}", "over_limit")
        if n < min_bytes or (pattern is not None and not pattern.fullmatch(v)):
            raise self.fail(name, "empty or badly formatted")
        return v

    def peer_id(self) -> str:
        return self.str("peer_id", MAX_PEER_ID_BYTES, min_bytes=1)

    def swarm_id(self) -> str:
        return self.str("swarm_id", MAX_SWARM_ID_BYTES, _SWARM_ID_RE, min_bytes=1)

    def bin(self, name: str, size: int) -> bytes:
        v = self.take(name)
        if type(v) is not bytes or len(v) != size:
            raise self.fail(name, f"expected {size} bytes (bin)")
        return v

    def packed(self, name: str, code: str, count: int) -> tuple | None:
        v = self.take(name)
        if v is None:
            return None
        if type(v) is not bytes or len(v) != 4 * count:
            raise self.fail(name, f"expected nil or {4 * count} bytes (bin, {count} x 4-byte little-endian)")
        return struct.unpack(f"<{count}{code}", v)

    def _list(self, name: str, max_len: int, min_len: int = 0) -> list:
        v = self.take(name)
        if type(v) is not list:
            raise self.fail(name, f"expected an array, got {type(v).__name__}")
        if len(v) > max_len:
            raise self.fail(name, f"{len(v)} items; the limit is {max_len}", "over_limit")
        if len(v) < min_len:
            raise self.fail(name, f"at least {min_len} item(s) required")
        return v

    def strs(self, name: str, max_len: int, max_bytes: int, pattern: re.Pattern) -> tuple[str, ...]:
        items = self._list(name, max_len)
        return tuple(self._check_str(v, f"{name}[{i}]", max_bytes, pattern, 1) for i, v in enumerate(items))

    def floats(self, name: str, max_len: int) -> tuple[float, ...]:
        items = self._list(name, max_len)
        if not all(type(v) is float and math.isfinite(v) for v in items):
            raise self.fail(name, "expected finite float64 values")
        return tuple(items)

    def map(self, name: str) -> _Reader:
        v = self.take(name)
        if type(v) is not dict:
            raise self.fail(name, f"expected a map, got {type(v).__name__}")
        return _Reader(v, f"{self.path}{name}.")

    def maps(self, name: str, max_len: int, min_len: int = 0) -> list[_Reader]:
        out = []
        for i, v in enumerate(self._list(name, max_len, min_len)):
            if type(v) is not dict:
                raise self.fail(f"{name}[{i}]", f"expected a map, got {type(v).__name__}")
            out.append(_Reader(v, f"{self.path}{name}[{i}]."))
        return out

    def config(self, name: str) -> dict[str, Any]:
        v = self.take(name)
        if type(v) is not dict:
            raise self.fail(name, f"expected a map, got {type(v).__name__}")
        _check_config(v, self.path + name, 1)
        return v

    def extra(self) -> dict[str, Any]:
        """Unknown fields: ignored by v1, but kept so the message re-encodes byte for byte."""
        return {k: v for k, v in self.d.items() if k not in self.used}


def _utf8_len(s: str, path: str) -> int:
    try:
        return len(s.encode("utf-8"))
    except UnicodeEncodeError:
        raise ProtocolError("bad_field", f"{path}: not valid UTF-8 (lone surrogate)") from None


def _check_config(v: Any, path: str, depth: int) -> None:
    """Task configs are JSON-like: nil, bool, int64, finite float, short str, small lists and maps."""
    if depth > MAX_CONFIG_DEPTH:
        raise ProtocolError("over_limit", f"{path}: nested deeper than {MAX_CONFIG_DEPTH}")
    if v is None or type(v) is bool:
        return
    if type(v) is int:
        if not INT64_MIN <= v <= INT64_MAX:
            raise ProtocolError("bad_field", f"{path}: integer outside int64")
    elif type(v) is float:
        if not math.isfinite(v):
            raise ProtocolError("bad_field", f"{path}: not finite")
    elif type(v) is str:
        if _utf8_len(v, path) > MAX_CONFIG_STR_BYTES:
            raise ProtocolError("over_limit", f"{path}: string over {MAX_CONFIG_STR_BYTES} bytes")
    elif type(v) is list:
        if len(v) > MAX_CONFIG_LIST:
            raise ProtocolError("over_limit", f"{path}: list over {MAX_CONFIG_LIST} items")
        for i, item in enumerate(v):
            _check_config(item, f"{path}[{i}]", depth + 1)
    elif type(v) is dict:
        if len(v) > MAX_CONFIG_ENTRIES:
            raise ProtocolError("over_limit", f"{path}: map over {MAX_CONFIG_ENTRIES} entries")
        for k, item in v.items():
            if not 1 <= _utf8_len(k, path) <= MAX_CONFIG_KEY_BYTES:
                raise ProtocolError(
                    "bad_field", f"{path}: key length outside 1..{MAX_CONFIG_KEY_BYTES} bytes"
                )
            _check_config(item, f"{path}.{k}", depth + 1)
    else:
        raise ProtocolError("bad_field", f"{path}: {type(v).__name__} is not allowed in a task config")


# ============================================================================================
# Stateful checks (pure parts), payload pulls, DHT layout
# ============================================================================================


def check_fresh(
    timestamp: float, now: float, *, max_age: float = 0.0, max_skew: float = MAX_CLOCK_SKEW_S
) -> None:
    """Raise ProtocolError("stale") unless now - max_age - max_skew <= timestamp <= now + max_skew.

    ``max_age`` is how old a message may legitimately be when it arrives: 0 for a message sent
    directly, the record's TTL for one read from the DHT (``roster_ttl_s`` / ``announce_ttl_s``).
    """
    if not now - max_age - max_skew <= timestamp <= now + max_skew:
        raise ProtocolError("stale", f"timestamp {timestamp:.3f} is {timestamp - now:+.1f} s from now")


def payload_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def announcement_for(
    batch: RolloutBatch, batch_bytes: bytes, *, timestamp: float, seq: int
) -> BatchAnnouncement:
    """The announcement of an encoded batch (sign it with ``encode_message``)."""
    return BatchAnnouncement(
        peer_id=batch.peer_id,
        swarm_id=batch.swarm_id,
        round=batch.round,
        policy_version=batch.policy_version,
        payload_sha256=payload_digest(batch_bytes),
        payload_len=len(batch_bytes),
        n_groups=len(batch.groups),
        timestamp=timestamp,
        seq=seq,
    )


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


def encode_pull_request(payload_sha256: bytes) -> bytes:
    if len(payload_sha256) != PULL_REQUEST_BYTES:
        raise ValueError("a pull request is a 32-byte sha256")
    return bytes(payload_sha256)


def parse_pull_request(data: bytes) -> bytes:
    if len(data) != PULL_REQUEST_BYTES:
        raise ProtocolError("malformed", f"pull request of {len(data)} bytes; expected {PULL_REQUEST_BYTES}")
    return bytes(data)


def encode_frame_header(length: int, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    if not 0 <= length <= max_bytes:
        raise ProtocolError("oversize", f"frame of {length} bytes; the limit is {max_bytes}")
    return length.to_bytes(FRAME_HEADER_BYTES, "big")


def parse_frame_header(header: bytes, max_bytes: int = MAX_FRAME_BYTES) -> int:
    """Body length from a 4-byte header; rejects before the body is read. 0 means "payload not here"."""
    if len(header) != FRAME_HEADER_BYTES:
        raise ProtocolError("malformed", f"frame header of {len(header)} bytes")
    length = int.from_bytes(header, "big")
    if length > max_bytes:
        raise ProtocolError("oversize", f"frame of {length} bytes; the limit is {max_bytes}")
    return length


def encode_frame(body: bytes, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    return encode_frame_header(len(body), max_bytes) + body


def validate_swarm_id(swarm_id: str) -> str:
    """Swarm ids name DHT keys: 1-64 of [A-Za-z0-9._-], starting with a letter or digit."""
    if not (
        isinstance(swarm_id, str) and len(swarm_id) <= MAX_SWARM_ID_BYTES and _SWARM_ID_RE.fullmatch(swarm_id)
    ):
        raise ValueError(
            f"invalid swarm id {swarm_id!r}: use 1-{MAX_SWARM_ID_BYTES} letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return swarm_id


def roster_key(swarm_id: str) -> str:
    """DHT key of the swarm's roster; subkey = peer id, value = encoded RosterCard."""
    return f"swarmnode/{validate_swarm_id(swarm_id)}/roster"


def announce_key(swarm_id: str) -> str:
    """DHT key of the swarm's announcements; subkey = peer id, value = that peer's latest encoded
    BatchAnnouncement. One key for all rounds: peers run at their own pace (and restart), so a reader
    takes every peer's newest batch whatever its round number."""
    return f"swarmnode/{validate_swarm_id(swarm_id)}/announce"


def roster_ttl_s(announce_period_s: float) -> float:
    return ROSTER_TTL_PERIODS * announce_period_s


def announce_ttl_s(round_period_s: float) -> float:
    return ANNOUNCE_TTL_ROUNDS * round_period_s


# ============================================================================================
# Conversions to and from the rollout types (rewards on the wire are claims, never inputs)
# ============================================================================================


@dataclass(frozen=True)
class ReceivedGroup:
    """A peer's group as received: the verifier regenerates the question from ``ref`` and scores."""

    ref: TaskRef
    completions: tuple[Completion, ...]
    claimed_rewards: tuple[float, ...]
    provenance: Provenance


def task_to_wire(ref: TaskRef) -> WireTask:
    return WireTask(dataset=ref.dataset, config=ref.config_dict(), seed=ref.seed, index=ref.index)


def task_from_wire(task: WireTask) -> TaskRef:
    return TaskRef.make(task.dataset, task.seed, task.index, task.config)


def completion_to_wire(
    c: Completion, *, include_logprobs: bool = True, n_tokens: int | None = None
) -> WireCompletion:
    """``n_tokens`` defaults to the length of ``token_ids`` or ``logprobs`` (0 when neither is known).
    Log-probs travel as float32 and token ids as uint32; both only when their length is ``n_tokens``."""
    if n_tokens is None:
        n_tokens = len(c.token_ids) if c.token_ids is not None else len(c.logprobs or ())
    ids = tuple(c.token_ids) if c.token_ids is not None and len(c.token_ids) == n_tokens else None
    lps = c.logprobs if include_logprobs and c.logprobs is not None and len(c.logprobs) == n_tokens else None
    if lps is not None:  # round to float32 now, so the wire object equals what the receiver decodes
        lps = struct.unpack(f"<{len(lps)}f", _pack_array("f", [float(x) for x in lps], "logprobs"))
    return WireCompletion(
        text=c.text,
        n_tokens=n_tokens,
        finished=c.finished,
        logprobs=lps,
        token_ids=None if ids is None else tuple(int(x) for x in ids),
    )


def completion_from_wire(c: WireCompletion) -> Completion:
    return Completion(text=c.text, token_ids=c.token_ids, logprobs=c.logprobs, finished=c.finished)


def group_to_wire(group: RolloutGroup, *, include_logprobs: bool = True) -> WireGroup:
    """Claimed rewards are the task scores (no format bonus), which every honest verifier reproduces
    whatever its own format_reward setting."""
    return WireGroup(
        task=task_to_wire(group.ref),
        completions=tuple(
            completion_to_wire(c, include_logprobs=include_logprobs) for c in group.completions
        ),
        claimed_rewards=tuple(float(r) for r in group.task_scores),
    )


def make_rollout_batch(
    groups: Sequence[RolloutGroup],
    *,
    peer_id: str,
    swarm_id: str,
    round: int,
    policy_version: int,
    model_name: str,
    tokenizer_fingerprint: str,
    timestamp: float,
    seq: int,
    include_logprobs: bool = True,
) -> RolloutBatch:
    return RolloutBatch(
        peer_id=peer_id,
        swarm_id=swarm_id,
        round=round,
        policy_version=policy_version,
        model_name=model_name,
        tokenizer_fingerprint=tokenizer_fingerprint,
        timestamp=float(timestamp),
        seq=seq,
        groups=tuple(group_to_wire(g, include_logprobs=include_logprobs) for g in groups),
    )


def batch_provenance(batch: RolloutBatch) -> Provenance:
    return Provenance(
        source="peer",
        producer=batch.peer_id,
        policy_version=batch.policy_version,
        round=batch.round,
        model_name=batch.model_name,
        tokenizer_fingerprint=batch.tokenizer_fingerprint,
    )


def received_groups(batch: RolloutBatch) -> list[ReceivedGroup]:
    provenance = batch_provenance(batch)
    return [
        ReceivedGroup(
            ref=task_from_wire(g.task),
            completions=tuple(completion_from_wire(c) for c in g.completions),
            claimed_rewards=g.claimed_rewards,
            provenance=provenance,
        )
        for g in batch.groups
    ]
