"""The wire protocol's limits and rules, version 1: message kinds, size limits, the decoder's hard limits,
the reject reasons and ``ProtocolError``, and the pure parts of the stateful checks (freshness, sequence
numbers, digests, swarm ids). PROTOCOL.md is the spec; the message types are ``wire.protocol``.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time

PROTOCOL_VERSION = 1
DOMAIN_PREFIX = b"swarmnode/v1/"  # signed bytes = prefix + type + 0x00 + swarm_id + 0x00 + canonical body

ROSTER_CARD = "roster_card"
BATCH_ANNOUNCEMENT = "batch_announcement"
ROLLOUT_BATCH = "rollout_batch"
MESSAGE_TYPES = (ROSTER_CARD, BATCH_ANNOUNCEMENT, ROLLOUT_BATCH)
OFFLINE_FIELD = "offline"  # RosterCard's optional "I am leaving" flag
WORK_NONCE_FIELD = "work_nonce"  # optional identity proof of work in cards and announcements (wire.work)

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


def check_fresh(
    timestamp: float, now: float, *, max_age: float = 0.0, max_skew: float = MAX_CLOCK_SKEW_S
) -> None:
    """Raise ProtocolError("stale") unless now - max_age - max_skew <= timestamp <= now + max_skew.

    ``max_age`` is how old a message may legitimately be when it arrives: swarmnode passes its record
    lifetime (``swarm.exchange.swarm.round_ttl_s``) for cards, announcements and batches alike
    (PROTOCOL.md section 7, "Lifetimes").
    """
    if not now - max_age - max_skew <= timestamp <= now + max_skew:
        raise ProtocolError("stale", f"timestamp {timestamp:.3f} is {timestamp - now:+.1f} s from now")


class Stamper:
    """A sender's ``(seq, timestamp)`` for the messages it signs: both strictly increasing, whatever the
    wall clock does (PROTOCOL.md section 7).

    ``seq = max(previous + 1, timestamp in milliseconds)`` keeps increasing across restarts without stored
    state. The timestamp does not go back either: after the clock steps back (an NTP step, a laptop
    waking up) it stays 1 ms past the last one until the clock catches up, so a receiver that sees a lower
    seq also sees an older timestamp (superseded, not a replay) and the DHT keeps the newest record of a
    subkey (it expires last). That lead is at most ``MAX_CLOCK_SKEW_S``: a clock that had run further ahead
    signed stamps receivers refused as stale, so the timestamp starts again from the clock.
    """

    def __init__(self) -> None:
        self._seq = 0
        self._timestamp = 0.0
        self._lock = threading.Lock()

    def stamp(self) -> tuple[int, float]:
        with self._lock:
            now = time.time()
            if now <= self._timestamp <= now + MAX_CLOCK_SKEW_S:
                now = self._timestamp + 0.001
            self._timestamp = now
            self._seq = max(self._seq + 1, int(now * 1000))
            return self._seq, now


def payload_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


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
