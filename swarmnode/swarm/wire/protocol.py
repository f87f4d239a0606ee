"""The wire protocol, version 1: the wire types, their limits and the reject reasons. The spec is
``protocol/PROTOCOL.md``; this module mirrors it.

Three signed messages travel between nodes: a ``RosterCard`` ("I am here, this model, these addresses";
a DHT record), a ``BatchAnnouncement`` ("I have a rollout batch for round r with this sha256"; a DHT
record) and the ``RolloutBatch`` itself (pulled over a libp2p stream, framed by this module).

Every message is a canonical msgpack envelope ``{"b": body, "k": public key, "s": signature, "t": type,
"v": 1}`` signed with the sender's Ed25519 identity (the key of its libp2p peer id). ``swarm.wire.codec``
encodes and decodes them: ``codec.decode_message`` checks, cheapest first: size, msgpack with hard
limits, envelope shape, version, canonical form, signature, peer id == key, expected sender, swarm, then
every field (each type's ``from_body``). It raises ``ProtocolError`` with a ``reason`` from
``REJECT_REASONS`` and nothing else, whatever the input. State-dependent checks (timestamp window,
per-sender sequence numbers, payload hash vs announcement) belong to the caller; ``check_fresh`` here
and ``codec.check_payload`` are the pure parts of them.

A batch carries task references, completions and *claimed* rewards only: no question, no answer. The
receiver regenerates both from the ``TaskRef`` and recomputes rewards itself (``swarm.exchange.verify``;
``swarm.wire.convert`` turns rollouts into wire types and back).
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # the field reader sits above this module (codec.py imports the types)
    from swarmnode.swarm.wire.codec import Reader

PROTOCOL_VERSION = 1
DOMAIN_PREFIX = b"swarmnode/v1/"  # signed bytes = prefix + type + 0x00 + swarm_id + 0x00 + canonical body

ROSTER_CARD = "roster_card"
BATCH_ANNOUNCEMENT = "batch_announcement"
ROLLOUT_BATCH = "rollout_batch"
MESSAGE_TYPES = (ROSTER_CARD, BATCH_ANNOUNCEMENT, ROLLOUT_BATCH)
OFFLINE_FIELD = "offline"  # RosterCard's optional "I am leaving" flag

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

# --- DHT records (checked where they are stored: swarm/dht.py; PROTOCOL.md section 8) ---------------
MAX_RECORD_TTL_S = 900.0  # a record expires <= its signed timestamp + this + RECORD_CLOCK_TOLERANCE_S
RECORD_CLOCK_TOLERANCE_S = 3.0  # hivemind's MAX_DHT_TIME_DISCREPANCY_SECONDS
ROSTER_SHARDS = 8  # roster keys per swarm (roster_key)
MAX_SUBKEYS_PER_KEY = 64  # subkeys one DHT key holds: 64 x 8 KiB stays far under hivemind's 4 MiB answer

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

SWARM_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
FINGERPRINT_RE = re.compile(r"[0-9a-f]*")
DATASET_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
ADDR_RE = re.compile(r"/[\x21-\x7e]*")
NO_CONTROL_RE = re.compile(r"[^\x00-\x1f\x7f]*")


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
    def from_body(cls, r: Reader) -> WireTask:
        return cls(
            dataset=r.str("dataset", MAX_DATASET_BYTES, DATASET_RE, min_bytes=1),
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
                "logprobs": None if self.logprobs is None else pack_array("f", self.logprobs, "logprobs"),
                "token_ids": None if self.token_ids is None else pack_array("I", self.token_ids, "token_ids"),
            },
            self.extra,
        )

    @classmethod
    def from_body(cls, r: Reader) -> WireCompletion:
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
    def from_body(cls, r: Reader) -> WireGroup:
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
    # "I am leaving": put on a clean shutdown so peers stop waiting at once. Optional on the wire (written
    # only when true) so that every card without it encodes as before and older nodes keep decoding it.
    offline: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False)

    def to_body(self) -> dict[str, Any]:
        known = {
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
        }
        if self.offline:
            known[OFFLINE_FIELD] = True
        return _with_extra(known, self.extra)

    @classmethod
    def from_body(cls, r: Reader) -> RosterCard:
        return cls(
            peer_id=r.peer_id(),
            swarm_id=r.swarm_id(),
            protocol_version=r.int("protocol_version", 1, INT64_MAX),
            model_name=r.str("model_name", MAX_NAME_BYTES, NO_CONTROL_RE, min_bytes=1),
            tokenizer_fingerprint=r.str("tokenizer_fingerprint", MAX_FINGERPRINT_CHARS, FINGERPRINT_RE),
            policy_version=r.int("policy_version", 0, INT64_MAX),
            round=r.int("round", 0, INT64_MAX),
            addrs=r.strs("addrs", MAX_ADDRS, MAX_ADDR_BYTES, ADDR_RE),
            timestamp=r.timestamp(),
            seq=r.int("seq", 0, INT64_MAX),
            offline=_offline(r),
            extra=r.extra(),
        )


def _offline(r: Reader) -> bool:
    """The optional offline flag: absent (online) or true; false is refused so that every card decodes
    to exactly one encoding."""
    if OFFLINE_FIELD not in r.d:
        return False
    if not r.bool(OFFLINE_FIELD):
        raise r.fail(OFFLINE_FIELD, "present only as true (absent means online)")
    return True


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
    def from_body(cls, r: Reader) -> BatchAnnouncement:
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
    def from_body(cls, r: Reader) -> RolloutBatch:
        return cls(
            peer_id=r.peer_id(),
            swarm_id=r.swarm_id(),
            round=r.int("round", 0, INT64_MAX),
            policy_version=r.int("policy_version", 0, INT64_MAX),
            model_name=r.str("model_name", MAX_NAME_BYTES, NO_CONTROL_RE, min_bytes=1),
            tokenizer_fingerprint=r.str("tokenizer_fingerprint", MAX_FINGERPRINT_CHARS, FINGERPRINT_RE),
            timestamp=r.timestamp(),
            seq=r.int("seq", 0, INT64_MAX),
            groups=tuple(WireGroup.from_body(g) for g in r.maps("groups", MAX_GROUPS_PER_BATCH, min_len=1)),
            extra=r.extra(),
        )


Message = RosterCard | BatchAnnouncement | RolloutBatch
MESSAGE_CLASSES: dict[str, type] = {c.TYPE: c for c in (RosterCard, BatchAnnouncement, RolloutBatch)}


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


def pack_array(code: str, values: Sequence[float | int], name: str) -> bytes:
    try:
        return struct.pack(f"<{len(values)}{code}", *values)
    except (struct.error, OverflowError, TypeError) as e:
        raise ProtocolError("bad_field", f"{name}: {e}") from None


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


def next_seq(previous: int) -> int:
    """A sender's next ``seq`` for one message type: max(previous + 1, unix time in milliseconds), so it
    keeps increasing across restarts without stored state (PROTOCOL.md section 7)."""
    return max(previous + 1, int(time.time() * 1000))


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
        isinstance(swarm_id, str) and len(swarm_id) <= MAX_SWARM_ID_BYTES and SWARM_ID_RE.fullmatch(swarm_id)
    ):
        raise ValueError(
            f"invalid swarm id {swarm_id!r}: use 1-{MAX_SWARM_ID_BYTES} letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return swarm_id


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
