"""The identity proof of work (PROTOCOL.md section 2, "Identity work"): what makes a new peer id cost CPU.

A peer id costs one Ed25519 key, so every bound a node keeps per identity (roster slots, pending pulls,
serving slots, scoring time) is only as strong as identities are dear. As in hashcash, and bound to the
key as S/Kademlia binds its node ids, an identity carries an 8-byte nonce such that

    sha256("swarmnode identity work v1" || public key (32 raw Ed25519 bytes) || nonce (8 bytes))

starts with at least d zero bits. d is a swarm setting (``swarm.identity_work_bits``), not a protocol
constant: minting takes 2^d hashes on average (a geometric number of tries: one mint in twenty takes over
three times that), checking takes one hash and one peer-id decoding (about 10 µs). The nonce travels in
the roster card (``RosterCard.work_nonce``); a receiver admits a card only when ``card_has_work(card, d)``
holds for its own d. ``mint`` counts up from nonce 0, so one key always gets the same proof at one d, and
a proof minted at a higher d also passes every lower one.
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Callable
from typing import Protocol

from swarmnode.identity import public_key_from_peer_id

WORK_DOMAIN = b"swarmnode identity work v1"
NONCE_BYTES = 8  # a big-endian counter: 2^64 tries, far past any d a swarm would ask
PUBLIC_KEY_BYTES = 32
DIGEST_BITS = 256  # sha256: no d past this can be met
PROGRESS_EVERY_S = 1.0  # at most one progress call a second of minting
_TRIES_PER_CLOCK_READ = 1 << 16  # ~30 ms of hashing between looks at the clock
_NONCE = struct.Struct(">Q")

Progress = Callable[[int, float], None]  # (tries so far, tries per second)


class CardWithWork(Protocol):
    """What ``card_has_work`` reads of a ``RosterCard`` (its peer id and its nonce)."""

    peer_id: str
    work_nonce: bytes


def work_digest(public_key: bytes, nonce: bytes) -> bytes:
    """sha256(WORK_DOMAIN || public key || nonce): the 32 bytes whose leading zero bits are the work."""
    return hashlib.sha256(WORK_DOMAIN + public_key + nonce).digest()


def leading_zero_bits(digest: bytes) -> int:
    """How many of the digest's first bits (big-endian, most significant first) are zero."""
    return 8 * len(digest) - int.from_bytes(digest, "big").bit_length()


def has_work(public_key: bytes, nonce: bytes, bits: int) -> bool:
    """True iff ``nonce`` proves ``bits`` of work for ``public_key``. Never raises: junk (wrong types or
    lengths, ``bits`` outside 0..DIGEST_BITS) is False; ``bits`` 0 asks for no work and is always True."""
    if type(bits) is not int or not 0 <= bits <= DIGEST_BITS:
        return False
    if bits == 0:
        return True
    if type(public_key) is not bytes or len(public_key) != PUBLIC_KEY_BYTES:
        return False
    if type(nonce) is not bytes or len(nonce) != NONCE_BYTES:
        return False
    return int.from_bytes(work_digest(public_key, nonce), "big") >> (DIGEST_BITS - bits) == 0


def card_has_work(card: CardWithWork, bits: int) -> bool:
    """True iff a decoded roster card's ``work_nonce`` proves ``bits`` of work for the key of its peer id
    (the decoder has checked that the peer id is the signer's). Never raises."""
    if type(bits) is int and bits == 0:
        return True
    peer_id = getattr(card, "peer_id", None)
    public_key = public_key_from_peer_id(peer_id) if type(peer_id) is str else None
    return public_key is not None and has_work(public_key, getattr(card, "work_nonce", None), bits)


def measure_rate(tries: int = _TRIES_PER_CLOCK_READ) -> float:
    """Tries per second of ``mint``'s loop on this machine, timed over ``tries`` hashes (~30 ms)."""
    fresh = hashlib.sha256(WORK_DOMAIN + bytes(PUBLIC_KEY_BYTES)).copy
    pack = _NONCE.pack
    start = time.perf_counter()
    for n in range(tries):
        h = fresh()
        h.update(pack(n))
        h.digest()
    return tries / max(time.perf_counter() - start, 1e-9)


def mint(
    public_key: bytes, bits: int, *, progress: Progress | None = None, every_s: float = PROGRESS_EVERY_S
) -> bytes:
    """The first nonce, counting up from 0, that proves ``bits`` of work for ``public_key``: 2^bits hashes
    on average. ``progress(tries, tries_per_s)`` is called at most once per ``every_s`` while minting."""
    if type(public_key) is not bytes or len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} raw bytes")
    if type(bits) is not int or not 0 <= bits <= DIGEST_BITS:
        raise ValueError(f"work bits must be an integer in 0..{DIGEST_BITS}, not {bits!r}")
    if bits == 0:  # every digest passes
        return _NONCE.pack(0)
    below = (1 << (DIGEST_BITS - bits)).to_bytes(DIGEST_BITS // 8, "big")  # digest < below: >= bits zeros
    fresh = hashlib.sha256(WORK_DOMAIN + public_key).copy  # the prefix hashed once, copied per try
    pack = _NONCE.pack
    start = last_said = time.monotonic()
    tried = 0
    while tried < 1 << (8 * NONCE_BYTES):
        for n in range(tried, tried + _TRIES_PER_CLOCK_READ):
            h = fresh()
            h.update(pack(n))
            if h.digest() < below:
                return pack(n)
        tried += _TRIES_PER_CLOCK_READ
        if progress is not None and (now := time.monotonic()) - last_said >= every_s:
            last_said = now
            progress(tried, tried / (now - start))
    raise ValueError(f"no {NONCE_BYTES}-byte nonce proves {bits} bits of work")  # never at a real d
