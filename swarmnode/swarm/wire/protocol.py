"""The wire protocol, version 1: the message types. The spec is ``protocol/PROTOCOL.md``; this module
mirrors it, with its limits and reject reasons in ``wire.limits``, the field checks in ``wire.reader``,
stream framing in ``wire.framing`` and the DHT layout in ``wire.dht_rules``.

Three signed messages travel between nodes: a ``RosterCard`` ("I am here, this model, these addresses";
a DHT record), a ``BatchAnnouncement`` ("I have a rollout batch for round r with this sha256"; a DHT
record) and the ``RolloutBatch`` itself (pulled over a libp2p stream, ``wire.framing``).

Every message is a canonical msgpack envelope ``{"b": body, "k": public key, "s": signature, "t": type,
"v": 1}`` signed with the sender's Ed25519 identity (the key of its libp2p peer id). ``swarm.wire.codec``
encodes and decodes them: ``codec.decode_message`` checks, cheapest first: size, msgpack with hard
limits, envelope shape, version, canonical form, signature, peer id == key, expected sender, swarm, then
every field (each type's ``from_body``). It raises ``ProtocolError`` with a ``reason`` from
``REJECT_REASONS`` and nothing else, whatever the input. State-dependent checks (timestamp window,
per-sender sequence numbers, payload hash vs announcement) belong to the caller; ``limits.check_fresh``
and ``codec.check_payload`` are the pure parts of them.

A batch carries task references, completions and *claimed* rewards only: no question, no answer. The
receiver regenerates both from the ``TaskRef`` and recomputes rewards itself (``swarm.exchange.verify``;
``swarm.wire.convert`` turns rollouts into wire types and back).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from swarmnode.swarm.wire.limits import (
    ADDR_RE,
    BATCH_ANNOUNCEMENT,
    DATASET_RE,
    FINGERPRINT_RE,
    INT64_MAX,
    INT64_MIN,
    MAX_ADDR_BYTES,
    MAX_ADDRS,
    MAX_COMPLETION_TEXT_BYTES,
    MAX_COMPLETION_TOKENS,
    MAX_COMPLETIONS_PER_GROUP,
    MAX_DATASET_BYTES,
    MAX_FINGERPRINT_CHARS,
    MAX_FRAME_BYTES,
    MAX_GROUPS_PER_BATCH,
    MAX_NAME_BYTES,
    MAX_RECORD_BYTES,
    NO_CONTROL_RE,
    OFFLINE_FIELD,
    PROTOCOL_VERSION,
    ROLLOUT_BATCH,
    ROSTER_CARD,
    WORK_NONCE_FIELD,
    ProtocolError,
    payload_digest,
)
from swarmnode.swarm.wire.reader import Reader
from swarmnode.swarm.wire.work import NONCE_BYTES


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
    # The identity's proof of work (``wire.work``): NONCE_BYTES, or b"" for none. Optional on the wire
    # (written only when present), so that every card without it encodes as before.
    work_nonce: bytes = b""
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
        if self.work_nonce:
            known[WORK_NONCE_FIELD] = bytes(self.work_nonce)
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
            work_nonce=r.bin(WORK_NONCE_FIELD, NONCE_BYTES) if WORK_NONCE_FIELD in r.d else b"",
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
    # The signer's proof of work, as in its card: a node storing the DHT record can tell it has work without
    # holding the card (``wire.dht_rules.record_work``). Optional on the wire, as in the card.
    work_nonce: bytes = b""
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, hash=False)

    def to_body(self) -> dict[str, Any]:
        known = {
            "peer_id": self.peer_id,
            "swarm_id": self.swarm_id,
            "round": self.round,
            "policy_version": self.policy_version,
            "payload_sha256": bytes(self.payload_sha256),
            "payload_len": self.payload_len,
            "n_groups": self.n_groups,
            "timestamp": float(self.timestamp),
            "seq": self.seq,
        }
        if self.work_nonce:
            known[WORK_NONCE_FIELD] = bytes(self.work_nonce)
        return _with_extra(known, self.extra)

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
            work_nonce=r.bin(WORK_NONCE_FIELD, NONCE_BYTES) if WORK_NONCE_FIELD in r.d else b"",
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


def announcement_for(
    batch: RolloutBatch, batch_bytes: bytes, *, timestamp: float, seq: int, work_nonce: bytes = b""
) -> BatchAnnouncement:
    """The announcement of an encoded batch (sign it with ``encode_message``), carrying the signer's proof
    of work ``work_nonce`` (b"": none)."""
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
        work_nonce=work_nonce,
    )
