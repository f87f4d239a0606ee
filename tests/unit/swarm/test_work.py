"""The identity proof of work: a nonce such that sha256(domain, public key, nonce) starts with d zero bits,
minted once per key, checked in microseconds, carried by the roster card (PROTOCOL.md section 2)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from swarmnode.identity import Identity
from swarmnode.swarm.wire import codec, limits, protocol, work
from tests.helpers.cards import roster_card

ROOT = Path(__file__).resolve().parents[3]
VECTOR_DIR = ROOT / "protocol" / "vectors" / "v1"
SWARM = "unit-swarm"
ME = Identity.from_seed(bytes([3]) * 32)  # its first 20-bit nonce is 777,070: a mint of ~0.3 s
OTHER = Identity.from_seed(bytes([4]) * 32)
KEY = bytes(32)


def card(**changes) -> protocol.RosterCard:
    return roster_card(ME, SWARM, **changes)


def vector(name: str) -> dict:
    return json.loads((VECTOR_DIR / f"{name}.json").read_text())


# --- minting and checking ------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [1, 4, 8, 12])
def test_a_minted_nonce_proves_its_bits_and_is_the_first_that_does(bits):
    nonce = work.mint(ME.public_key, bits)
    assert len(nonce) == work.NONCE_BYTES and work.has_work(ME.public_key, nonce, bits)
    digest = hashlib.sha256(b"swarmnode identity work v1" + ME.public_key + nonce).digest()
    assert digest == work.work_digest(ME.public_key, nonce)
    assert work.leading_zero_bits(digest) >= bits
    found = int.from_bytes(nonce, "big")
    assert not any(work.has_work(ME.public_key, n.to_bytes(8, "big"), bits) for n in range(found))
    assert work.mint(ME.public_key, bits) == nonce  # one key, one d: one proof


def test_the_proof_is_bound_to_the_key():
    nonce = work.mint(ME.public_key, 12)
    assert work.has_work(ME.public_key, nonce, 12) and not work.has_work(OTHER.public_key, nonce, 12)


def test_the_bits_boundary_is_exact():
    nonce = work.mint(ME.public_key, 10)
    zeros = work.leading_zero_bits(work.work_digest(ME.public_key, nonce))
    assert zeros >= 10
    assert work.has_work(ME.public_key, nonce, zeros)
    assert not work.has_work(ME.public_key, nonce, zeros + 1)


def test_leading_zero_bits():
    assert work.leading_zero_bits(bytes(32)) == 256
    assert work.leading_zero_bits(b"\x80" + bytes(31)) == 0
    assert work.leading_zero_bits(b"\x00\x01" + bytes(30)) == 15
    assert work.leading_zero_bits(b"\x00\x00\x7f" + b"\xff" * 29) == 17


def test_zero_bits_asks_for_nothing():
    assert work.mint(ME.public_key, 0) == bytes(8)
    assert work.has_work(ME.public_key, b"", 0) and work.has_work(None, None, 0)
    assert work.card_has_work(card(), 0)


@pytest.mark.parametrize(
    "public_key, nonce, bits",
    [
        (None, bytes(8), 1),
        ("k" * 32, bytes(8), 1),
        (bytearray(32), bytes(8), 1),
        (bytes(31), bytes(8), 1),
        (bytes(33), bytes(8), 1),
        (bytes(32), None, 1),
        (bytes(32), b"", 1),
        (bytes(32), bytes(7), 1),
        (bytes(32), bytes(9), 1),
        (bytes(32), "0" * 8, 1),
        (bytes(32), bytes(8), -1),
        (bytes(32), bytes(8), 257),
        (bytes(32), bytes(8), 1.0),
        (bytes(32), bytes(8), "1"),
        (bytes(32), bytes(8), None),
        (bytes(32), bytes(8), True),
        (bytes(32), bytes(8), 2**70),
    ],
)
def test_junk_is_no_work_and_never_raises(public_key, nonce, bits):
    assert work.has_work(public_key, nonce, bits) is False


def test_every_digest_fails_at_256_bits_but_no_check_raises():
    nonce = work.mint(ME.public_key, 8)
    assert work.has_work(ME.public_key, nonce, 8) and not work.has_work(ME.public_key, nonce, 256)


@pytest.mark.parametrize("key, bits", [(bytes(31), 8), ("k" * 32, 8), (KEY, -1), (KEY, 257), (KEY, "8")])
def test_mint_refuses_what_it_cannot_prove(key, bits):
    with pytest.raises(ValueError):
        work.mint(key, bits)


def test_mint_says_its_progress_with_tries_and_rate():
    said: list[tuple[int, float]] = []
    nonce = work.mint(ME.public_key, 20, progress=lambda tries, rate: said.append((tries, rate)), every_s=0)
    found = int.from_bytes(nonce, "big")
    assert found == 777_070 and work.has_work(ME.public_key, nonce, 20)
    assert len(said) == found // 65536  # one call per look at the clock, before the one that found it
    assert [tries for tries, _ in said] == [65536 * (i + 1) for i in range(len(said))]
    assert all(rate > 0 for _, rate in said)
    at: list[float] = []
    work.mint(ME.public_key, 20, progress=lambda *_: at.append(time.monotonic()), every_s=0.05)
    assert at and all(later - earlier >= 0.05 for earlier, later in zip(at, at[1:], strict=False))


def test_checking_takes_microseconds():
    nonce = work.mint(ME.public_key, 16)
    carded = card(work_nonce=nonce)
    start = time.perf_counter()
    for _ in range(1000):
        assert work.card_has_work(carded, 16)
    assert time.perf_counter() - start < 0.5  # ~10 µs each here; 500 µs allows a loaded machine


# --- the roster card carries it ------------------------------------------------------------------


def test_a_card_with_a_nonce_round_trips_and_proves_its_work():
    nonce = work.mint(ME.public_key, 12)
    data = codec.encode_message(ME, SWARM, card(work_nonce=nonce))
    decoded, _ = codec.decode_message(data, swarm_id=SWARM, expected_type=limits.ROSTER_CARD)
    assert decoded.work_nonce == nonce and decoded.to_body()[limits.WORK_NONCE_FIELD] == nonce
    assert codec.encode_message(ME, SWARM, decoded) == data
    assert work.card_has_work(decoded, 12)
    zeros = work.leading_zero_bits(work.work_digest(ME.public_key, nonce))
    assert not work.card_has_work(decoded, zeros + 1)


def test_a_card_without_a_nonce_has_no_field_and_no_work():
    plain = card()
    assert plain.work_nonce == b"" and limits.WORK_NONCE_FIELD not in plain.to_body()
    decoded, _ = codec.decode_message(codec.encode_message(ME, SWARM, plain), swarm_id=SWARM)
    assert decoded.work_nonce == b""
    assert not work.card_has_work(decoded, 1) and work.card_has_work(decoded, 0)


def test_another_peers_nonce_proves_nothing_for_this_card():
    theirs = work.mint(OTHER.public_key, 12)
    assert work.has_work(OTHER.public_key, theirs, 12)
    assert not work.card_has_work(card(work_nonce=theirs), 12)


def test_a_card_of_a_peer_id_without_an_ed25519_key_has_no_work():
    rsa_like = replace(card(work_nonce=bytes(8)), peer_id="QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")
    assert not work.card_has_work(rsa_like, 1)
    assert not work.card_has_work(replace(card(), peer_id="not base58 !"), 1)
    for junk in (123, None, b"12D3KooW", object()):
        assert not work.card_has_work(replace(card(work_nonce=bytes(8)), peer_id=junk), 1)
    assert not work.card_has_work(object(), 1) and not work.card_has_work(card(), True)


@pytest.mark.parametrize("value", [b"", bytes(7), bytes(9), "00" * 8, 0, None, [0] * 8])
def test_a_nonce_of_another_shape_is_refused_as_a_bad_field(value):
    body = {**card().to_body(), limits.WORK_NONCE_FIELD: value}
    body_bytes = codec.canonical_packb(body)
    signature = ME.sign(codec.signing_bytes(limits.ROSTER_CARD, SWARM, body_bytes))
    data = codec.pack_envelope(limits.ROSTER_CARD, body_bytes, ME.public_key, signature)
    with pytest.raises(limits.ProtocolError) as info:
        codec.decode_message(data, swarm_id=SWARM, expected_type=limits.ROSTER_CARD)
    assert info.value.reason == "bad_field" and limits.WORK_NONCE_FIELD in str(info.value)
    with pytest.raises(limits.ProtocolError):  # nor does this node sign one
        codec.encode_message(ME, SWARM, card(work_nonce=bytes(7)))


# --- the vectors -----------------------------------------------------------------------------------


def test_an_old_card_without_the_field_decodes_and_re_encodes_byte_for_byte():
    v = vector("roster_card_valid")
    data = bytes.fromhex(v["hex"])
    decoded, _ = codec.decode_message(data, swarm_id=v["swarm_id"], expected_type=limits.ROSTER_CARD)
    assert decoded.work_nonce == b"" and "work_nonce" not in v["body"]
    signer = Identity.from_seed(bytes.fromhex(v["signer_seed"]))
    assert codec.encode_message(signer, v["swarm_id"], decoded) == data


def test_the_identity_work_vectors():
    valid, too_few, other = (
        vector(n) for n in ("identity_work_valid", "identity_work_too_few_bits", "identity_work_other_key")
    )
    signer = Identity.from_seed(bytes.fromhex(valid["signer_seed"]))
    assert valid["public_key"] == signer.public_key.hex() and valid["peer_id"] == signer.peer_id
    nonce = bytes.fromhex(valid["nonce"])
    assert work.mint(signer.public_key, valid["bits"]) == nonce  # the first nonce from 0
    assert work.has_work(signer.public_key, nonce, valid["bits"]) and valid["verdict"] == "accept"
    assert too_few["bits"] == valid["leading_zero_bits"] + 1 and too_few["verdict"] == "no_identity_work"
    assert not work.has_work(signer.public_key, nonce, too_few["bits"])
    assert other["nonce"] == valid["nonce"] and other["public_key"] != valid["public_key"]
    assert not work.has_work(bytes.fromhex(other["public_key"]), nonce, other["bits"])


def test_the_card_vector_carries_the_vector_proof():
    v, proof = vector("roster_card_work_nonce"), vector("identity_work_valid")
    decoded, _ = codec.decode_message(
        bytes.fromhex(v["hex"]), swarm_id=v["swarm_id"], expected_type=limits.ROSTER_CARD
    )
    assert decoded.work_nonce.hex() == proof["nonce"] == v["body"]["work_nonce"]["$bin"]
    assert work.card_has_work(decoded, proof["bits"])
    assert not work.card_has_work(decoded, proof["leading_zero_bits"] + 1)
    assert vector("work_nonce_wrong_length")["verdict"] == "bad_field"
