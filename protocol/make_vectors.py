"""Generate the protocol test vectors in protocol/vectors/v1/ (deterministic: fixed keys, fixed times).

    python protocol/make_vectors.py          # (re)write the files
    python protocol/make_vectors.py --check  # exit 1 if the committed files differ from what this makes

Ed25519 signatures are deterministic, so the same keys and bodies always give the same bytes. The
keys below are public test keys: never use them for anything else. See PROTOCOL.md, "Test vectors".
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack

from swarmnode.identity import Identity, peer_id_from_public_key
from swarmnode.swarm.wire import codec, framing, limits, protocol, work
from swarmnode.swarm.wire import dht_rules as dht

VECTOR_DIR = Path(__file__).resolve().parent / "vectors" / "v1"

SEED_A = bytes.fromhex("a1" * 16 + "0123456789abcdef0123456789abcdef")  # the honest sender
SEED_B = bytes.fromhex("b2" * 16 + "fedcba9876543210fedcba9876543210")  # another peer
SWARM = "vector-swarm"
TIMESTAMP = 1767225600.25  # 2026-01-01T00:00:00.25Z
FINGERPRINT = "3f" * 32
WORK_BITS = 16  # the identity proof in the vectors (a swarm sets its own d: PROTOCOL.md section 2)

A = Identity.from_seed(SEED_A)
B = Identity.from_seed(SEED_B)
NONCE = work.mint(A.public_key, WORK_BITS)  # A's identity proof (identity_work_valid)


# --- messages ------------------------------------------------------------------------------------


def roster_card(**changes: Any) -> protocol.RosterCard:
    fields = dict(
        peer_id=A.peer_id,
        swarm_id=SWARM,
        model_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        tokenizer_fingerprint=FINGERPRINT,
        policy_version=7,
        round=42,
        addrs=("/ip4/192.0.2.10/tcp/31337", f"/ip4/192.0.2.10/udp/31337/quic-v1/p2p/{A.peer_id}"),
        timestamp=TIMESTAMP,
        seq=1001,
    )
    return protocol.RosterCard(**{**fields, **changes})


def completion(text: str, *, logprobs: bool, n_tokens: int = 4, **changes: Any) -> protocol.WireCompletion:
    return protocol.WireCompletion(
        text=text,
        n_tokens=n_tokens,
        finished=True,
        logprobs=(-0.5, -1.25, -0.0078125, -3.0)[:n_tokens] if logprobs else None,
        token_ids=(17, 256, 70000, 2)[:n_tokens] if logprobs else None,
        **changes,
    )


def rollout_batch(*, logprobs: bool, n_groups: int = 2, **changes: Any) -> protocol.RolloutBatch:
    groups = []
    for i in range(n_groups):
        task = protocol.WireTask(
            dataset="basic_arithmetic",
            config={
                "min_terms": 2,
                "max_terms": 3,
                "operators": ["+", "-"],
                "allow_decimals": False,
                "p": 0.5,
            },
            seed=1234,
            index=i,
        )
        completions = (
            completion("<answer>7</answer>", logprobs=logprobs),
            completion("Die Antwort ist <answer>8</answer> — grüß dich 🙂", logprobs=logprobs),
        )
        groups.append(protocol.WireGroup(task=task, completions=completions, claimed_rewards=(1.0, 0.0)))
    fields = dict(
        peer_id=A.peer_id,
        swarm_id=SWARM,
        round=42,
        policy_version=7,
        model_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        tokenizer_fingerprint=FINGERPRINT,
        timestamp=TIMESTAMP,
        seq=1003,
        groups=tuple(groups),
    )
    return protocol.RolloutBatch(**{**fields, **changes})


def announcement(
    batch_bytes: bytes, batch: protocol.RolloutBatch, work_nonce: bytes = b""
) -> protocol.BatchAnnouncement:
    return protocol.announcement_for(batch, batch_bytes, timestamp=TIMESTAMP, seq=1002, work_nonce=work_nonce)


def sign_raw(
    identity: Identity, msg_type: str, swarm_id: str, body: dict[str, Any], version: int = 1
) -> bytes:
    """Sign any body (bypassing the encoder's field checks) into a canonical envelope."""
    body_bytes = codec.canonical_packb(body)
    signature = identity.sign(codec.signing_bytes(msg_type, swarm_id, body_bytes))
    return codec.pack_envelope(msg_type, body_bytes, identity.public_key, signature, version)


def with_body(msg: Any, drop: str | None = None, **set_: Any) -> dict[str, Any]:
    body = msg.to_body()
    if drop:
        del body[drop]
    body.update(set_)
    return body


# --- vectors -------------------------------------------------------------------------------------


def message(
    name: str,
    description: str,
    data: bytes,
    verdict: str,
    *,
    expected_type: str | None,
    swarm_id: str = SWARM,
    expected_peer_id: str | None = None,
    signer: Identity = A,
) -> dict[str, Any]:
    v: dict[str, Any] = {
        "name": name,
        "description": description,
        "kind": "message",
        "swarm_id": swarm_id,
        "type": expected_type,
        "expected_peer_id": expected_peer_id,
        "hex": data.hex(),
        "verdict": verdict,
    }
    if verdict == "accept":
        msg, sender = codec.decode_message(
            data, swarm_id=swarm_id, expected_type=expected_type, expected_peer_id=expected_peer_id
        )
        assert sender == signer.peer_id
        v["sender_peer_id"] = sender
        v["signer_seed"] = SEED_A.hex() if signer is A else SEED_B.hex()
        v["body"] = body_json(msg.to_body())
    else:
        try:
            codec.decode_message(
                data, swarm_id=swarm_id, expected_type=expected_type, expected_peer_id=expected_peer_id
            )
        except limits.ProtocolError as e:
            assert e.reason == verdict, (name, e)
        else:
            raise AssertionError(f"{name}: accepted, expected {verdict}")
    return v


def frame_header(name: str, description: str, data: bytes, verdict: str) -> dict[str, Any]:
    v: dict[str, Any] = {
        "name": name,
        "description": description,
        "kind": "frame_header",
        "hex": data.hex(),
        "verdict": verdict,
    }
    if verdict == "accept":
        v["length"] = framing.parse_frame_header(data)
    return v


def body_json(value: Any) -> Any:
    """JSON view of a decoded body: bin values become {"$bin": hex}, map keys sorted."""
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    if isinstance(value, dict):
        return {k: body_json(value[k]) for k in sorted(value)}
    if isinstance(value, list | tuple):
        return [body_json(x) for x in value]
    return value


def dht_record(
    name: str, description: str, key: str, subkey: str | None, value: bytes, expiration: float, now: float
) -> dict[str, Any]:
    """A DHT record as a storing node sees it (PROTOCOL.md section 8): its verdict is swarm.dht.check_record's
    on hivemind's encoding (key id = sha1 of the msgpack-encoded key, subkey and value msgpack-encoded)."""
    verdict = dht.check_record(
        dht.key_id(key), msgpack.packb(subkey), msgpack.packb(value, use_bin_type=True), expiration, now
    )
    return {
        "name": name,
        "description": description,
        "kind": "dht_record",
        "key": key,
        "subkey": subkey,
        "hex": value.hex(),
        "expiration": expiration,
        "now": now,
        "verdict": verdict or "accept",
    }


def record_vectors() -> list[dict[str, Any]]:
    card_bytes = codec.encode_message(A, SWARM, roster_card())
    batch = rollout_batch(logprobs=False, n_groups=1)
    batch_bytes = codec.encode_message(A, SWARM, batch)
    ann_bytes = codec.encode_message(A, SWARM, announcement(batch_bytes, batch))
    roster, announce = dht.roster_key(SWARM, A.peer_id), dht.announce_key(SWARM, A.peer_id)
    ttl = dht.MAX_RECORD_TTL_S + dht.RECORD_CLOCK_TOLERANCE_S
    now, exp = TIMESTAMP + 1.0, TIMESTAMP + 60.0
    return [
        dht_record("record_roster_card", "A's card in its roster shard, under its own subkey.",
                   roster, A.peer_id, card_bytes, exp, now),
        dht_record("record_announcement", "A's announcement under its own announcement key.",
                   announce, A.peer_id, ann_bytes, exp, now),
        dht_record("record_latest_expiration", "Expiring at timestamp + MAX_RECORD_TTL_S + tolerance.",
                   roster, A.peer_id, card_bytes, TIMESTAMP + ttl, now),
        dht_record("record_far_expiration", "Expiring 1 s past timestamp + MAX_RECORD_TTL_S + tolerance: "
                   "a pin.", roster, A.peer_id, card_bytes, TIMESTAMP + ttl + 1.0, now),
        dht_record("record_from_the_future", "Signed more than MAX_CLOCK_SKEW_S ahead of the storing node.",
                   roster, A.peer_id, card_bytes, exp, TIMESTAMP - limits.MAX_CLOCK_SKEW_S - 1.0),
        dht_record("record_no_subkey", "A plain value at the key: it would replace the whole dictionary.",
                   roster, None, card_bytes, exp, now),
        dht_record("record_subkey_not_the_signer", "A's card under B's subkey (pinning B's place).",
                   dht.roster_key(SWARM, B.peer_id), B.peer_id, card_bytes, exp, now),
        dht_record("record_card_under_the_announce_key", "A's card under A's announcement key.",
                   announce, A.peer_id, card_bytes, exp, now),
        dht_record("record_card_of_another_swarm", "A's card under A's roster shard of another swarm.",
                   dht.roster_key("another-swarm", A.peer_id), A.peer_id, card_bytes, exp, now),
        dht_record("record_rollout_batch", "A rollout batch never belongs in the DHT.",
                   announce, A.peer_id, batch_bytes, exp, now),
        dht_record("record_not_a_message", "Bytes that are not a signed message.",
                   announce, A.peer_id, b"plain value", exp, now),
        dht_record("record_oversize", "MAX_RECORD_BYTES + 1 bytes: refused before decoding.",
                   announce, A.peer_id, bytes(limits.MAX_RECORD_BYTES + 1), exp, now),
        dht_record("record_announcement_latest_expiration", "An announcement expiring at timestamp + "
                   "ANNOUNCE_RECORD_TTL_S: what its author stores.",
                   announce, A.peer_id, ann_bytes, TIMESTAMP + dht.ANNOUNCE_RECORD_TTL_S, now),
        dht_record("record_announcement_replay", "An announcement expiring at timestamp + 902 s, past "
                   "timestamp + ANNOUNCE_RECORD_TTL_S: a replay that would outlive the author's newer ones.",
                   announce, A.peer_id, ann_bytes, TIMESTAMP + 902.0, now),
    ]  # fmt: skip


def identity_work(name: str, description: str, identity: Identity, nonce: bytes, bits: int) -> dict[str, Any]:
    """An identity proof (PROTOCOL.md section 2, "Identity work"): ``accept`` when the digest has at least
    ``bits`` leading zero bits, else ``no_identity_work`` (what a receiver asking for ``bits`` refuses)."""
    digest = work.work_digest(identity.public_key, nonce)
    return {
        "name": name,
        "description": description,
        "kind": "identity_work",
        "signer_seed": SEED_A.hex() if identity is A else SEED_B.hex(),
        "public_key": identity.public_key.hex(),
        "peer_id": identity.peer_id,
        "nonce": nonce.hex(),
        "digest": digest.hex(),
        "leading_zero_bits": work.leading_zero_bits(digest),
        "bits": bits,
        "verdict": "accept" if work.has_work(identity.public_key, nonce, bits) else "no_identity_work",
    }


def work_vectors() -> list[dict[str, Any]]:
    nonce = work.mint(A.public_key, WORK_BITS)
    zeros = work.leading_zero_bits(work.work_digest(A.public_key, nonce))
    return [
        identity_work("identity_work_valid", f"A's proof at d = {WORK_BITS}: the first nonce, counting up "
                      "from 0, whose digest has at least d leading zero bits.", A, nonce, WORK_BITS),
        identity_work("identity_work_too_few_bits", "The same proof where one bit more than its digest's "
                      "leading zero bits is asked.", A, nonce, zeros + 1),
        identity_work("identity_work_other_key", "A's nonce with B's key: the proof is bound to the key.",
                      B, nonce, WORK_BITS),
    ]  # fmt: skip


def stored_work(
    name: str, description: str, key: str, subkey: str, value: bytes, bits: int, *, home: bool
) -> dict[str, Any]:
    """How a storing node that asks ``bits`` of identity work ranks a record it keeps (PROTOCOL.md section 8,
    "Identity work where records are stored"): ``work_bits`` is what the record's signer proves, ``verdict``
    ``with_work``, ``without_work`` or ``no_identity_work`` (refused), for a node holding no card of the
    signer; ``home``: the record's swarm is the node's own."""
    stored = msgpack.packb(value, use_bin_type=True)
    assert (
        dht.check_record(dht.key_id(key), msgpack.packb(subkey), stored, TIMESTAMP + 60.0, TIMESTAMP) is None
    )
    read = dht.record_work(stored)
    return {
        "name": name,
        "description": description,
        "kind": "dht_work",
        "key": key,
        "subkey": subkey,
        "hex": value.hex(),
        "bits": bits,
        "home": home,
        "work_bits": read.work_bits,
        "verdict": dht.work_verdict(read, bits, home=home),
    }


def stored_work_vectors() -> list[dict[str, Any]]:
    batch = rollout_batch(logprobs=False, n_groups=1)
    batch_bytes = codec.encode_message(A, SWARM, batch)
    card = codec.encode_message(A, SWARM, roster_card(work_nonce=NONCE))
    bare_card = codec.encode_message(A, SWARM, roster_card())
    ann = codec.encode_message(A, SWARM, announcement(batch_bytes, batch, work_nonce=NONCE))
    bare_ann = codec.encode_message(A, SWARM, announcement(batch_bytes, batch))
    roster, announce = dht.roster_key(SWARM, A.peer_id), dht.announce_key(SWARM, A.peer_id)
    zeros = work.leading_zero_bits(work.work_digest(A.public_key, NONCE))
    return [
        stored_work("stored_work_card", f"A's card with its proof, at a node of its swarm asking d = "
                    f"{WORK_BITS}.", roster, A.peer_id, card, WORK_BITS, home=True),
        stored_work("stored_work_card_too_few_bits", "The same card at a node of its swarm asking one bit "
                    "more than it proves: refused.", roster, A.peer_id, card, zeros + 1, home=True),
        stored_work("stored_work_card_without_nonce", "A's card without a proof, at a node of its swarm: "
                    "refused (every reader of the swarm refuses it).", roster, A.peer_id, bare_card,
                    WORK_BITS, home=True),
        stored_work("stored_work_card_of_another_swarm", "The same card without a proof, at a node of "
                    "another swarm: kept, ranked without work.", roster, A.peer_id, bare_card, WORK_BITS,
                    home=False),
        stored_work("stored_work_announcement", "A's announcement carrying its proof: with work wherever "
                    "it is stored.", announce, A.peer_id, ann, WORK_BITS, home=True),
        stored_work("stored_work_announcement_without_nonce", "A's announcement without a proof: without "
                    "work, unless the storing node holds A's card with work.", announce, A.peer_id,
                    bare_ann, WORK_BITS, home=True),
        stored_work("stored_work_d_0", "A's card without a proof at a node asking no work (d = 0).",
                    roster, A.peer_id, bare_card, 0, home=True),
    ]  # fmt: skip


def build_vectors() -> list[dict[str, Any]]:
    return message_vectors() + record_vectors() + work_vectors() + stored_work_vectors()


def message_vectors() -> list[dict[str, Any]]:
    card = roster_card()
    card_bytes = codec.encode_message(A, SWARM, card)
    batch = rollout_batch(logprobs=True)
    batch_bytes = codec.encode_message(A, SWARM, batch)
    batch_plain = rollout_batch(logprobs=False, seq=1005)
    ann_bytes = codec.encode_message(A, SWARM, announcement(batch_bytes, batch))
    RC, BA, RB = limits.ROSTER_CARD, limits.BATCH_ANNOUNCEMENT, limits.ROLLOUT_BATCH

    card_signed = codec.signing_bytes(RC, SWARM, codec.canonical_packb(card.to_body()))
    forged = card_bytes.replace(A.sign(card_signed), B.sign(card_signed))
    assert forged != card_bytes and len(forged) == len(card_bytes)

    flipped = bytearray(batch_bytes)
    i = batch_bytes.index(b"<answer>8</answer>") + 9
    flipped[i] ^= ord("8") ^ ord("9")  # the claimed completion text, changed after signing

    small_order_key = bytes([1]) + bytes(31)  # the neutral point: "verifies" S = 0 with R = neutral
    small_body = with_body(card, peer_id=peer_id_from_public_key(small_order_key))
    small = codec.pack_envelope(
        RC, codec.canonical_packb(small_body), small_order_key, bytes([1]) + bytes(63)
    )

    unsorted_body = codec.canonical_packb(card.to_body())  # signature over the canonical body ...
    sig = A.sign(codec.signing_bytes(RC, SWARM, unsorted_body))
    raw_env = {"b": card.to_body(), "k": A.public_key, "s": sig, "t": RC, "v": 1}  # ... body sent unsorted
    non_canonical_order = msgpack.packb(raw_env, use_bin_type=True)

    f32_env = msgpack.packb(
        {"b": codec._canonical(card.to_body(), 1), "k": A.public_key, "s": sig, "t": RC, "v": 1},
        use_bin_type=True,
        use_single_float=True,
    )

    extra_card = roster_card(extra={"region": "eu-west", "x_future": {"capacity": 3, "gpus": ["h100"]}})
    extra_batch = rollout_batch(logprobs=False, seq=1007, n_groups=1)
    g = extra_batch.groups[0]
    g2 = protocol.WireGroup(
        task=replace(g.task, extra={"difficulty": 0.25}),
        completions=(replace(g.completions[0], extra={"sampler": "vllm"}), g.completions[1]),
        claimed_rewards=g.claimed_rewards,
        extra={"note": None},
    )
    extra_batch = replace(extra_batch, groups=(g2,))

    big_card = roster_card(extra={"padding": "x" * (limits.MAX_RECORD_BYTES - 400)})
    big = sign_raw(A, RC, SWARM, big_card.to_body())
    assert len(big) > limits.MAX_RECORD_BYTES

    boundaries = rollout_batch(logprobs=False, n_groups=1, seq=1011)
    config = {f"i{n}": n for n in (0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1)}
    config |= {f"n{-n}": n for n in (-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1)}
    config |= {"nmin": -(2**63), "f": -0.0, "s31": "x" * 31, "s32": "x" * 32, "s256": "y" * 256}
    config |= {"l15": list(range(15)), "l16": list(range(16)), "a": 1, "ab": 2, "a_b": 3, "Z": 4, "ä": 5}
    long_completion = protocol.WireCompletion(
        text="é" * 8000, n_tokens=64, logprobs=tuple(-i / 64 for i in range(64)), token_ids=tuple(range(64))
    )
    boundaries = replace(
        boundaries,
        groups=(replace(boundaries.groups[0], task=replace(boundaries.groups[0].task, config=config)),)
        + (
            protocol.WireGroup(
                task=boundaries.groups[0].task, completions=(long_completion,), claimed_rewards=(0.1,)
            ),
        ),
    )

    too_many = rollout_batch(logprobs=False, n_groups=limits.MAX_GROUPS_PER_BATCH + 1, seq=1009)
    mismatch_lp = with_body(batch)
    mismatch_lp["groups"][0]["completions"][0]["logprobs"] = struct.pack("<3f", -0.5, -1.0, -2.0)
    nan_reward = with_body(batch)
    nan_reward["groups"][1]["claimed_rewards"][0] = float("nan")

    return [
        # --- accepted ---------------------------------------------------------------------------
        message(
            "roster_card_valid", "A roster card signed by its peer.", card_bytes, "accept", expected_type=RC
        ),
        message(
            "batch_announcement_valid",
            "The announcement of rollout_batch_valid_logprobs (its sha256 and length).",
            ann_bytes,
            "accept",
            expected_type=BA,
        ),
        message(
            "rollout_batch_valid_logprobs",
            "Two groups of two completions with float32 log-probs and uint32 "
            "token ids; non-ASCII text; nested task config.",
            batch_bytes,
            "accept",
            expected_type=RB,
        ),
        message(
            "rollout_batch_valid_no_logprobs",
            "The same groups without log-probs or token ids (nil).",
            codec.encode_message(A, SWARM, batch_plain),
            "accept",
            expected_type=RB,
        ),
        message(
            "roster_card_any_type",
            "A valid roster card decoded without an expected type.",
            card_bytes,
            "accept",
            expected_type=None,
        ),
        message(
            "roster_card_offline",
            "A roster card marked offline (a clean shutdown): the optional 'offline' field, written only "
            "when true.",
            codec.encode_message(A, SWARM, roster_card(offline=True, seq=1002)),
            "accept",
            expected_type=RC,
        ),
        message(
            "roster_card_work_nonce",
            f"A roster card carrying A's identity proof (identity_work_valid, d = {WORK_BITS}) in the "
            "optional 'work_nonce' field, written only when the card has one.",
            codec.encode_message(A, SWARM, roster_card(work_nonce=work.mint(A.public_key, WORK_BITS))),
            "accept",
            expected_type=RC,
        ),
        message(
            "batch_announcement_work_nonce",
            f"An announcement carrying its signer's identity proof (identity_work_valid, d = {WORK_BITS}) "
            "in the optional 'work_nonce' field, as in its card: DHT storing nodes rank by it (section 8).",
            codec.encode_message(A, SWARM, announcement(batch_bytes, batch, work_nonce=NONCE)),
            "accept",
            expected_type=BA,
        ),
        message(
            "roster_card_unknown_fields",
            "Unknown body fields are ignored but signed, and re-encode exactly.",
            codec.encode_message(A, SWARM, extra_card),
            "accept",
            expected_type=RC,
        ),
        message(
            "rollout_batch_unknown_nested_fields",
            "Unknown fields inside a group, a task and a completion.",
            codec.encode_message(A, SWARM, extra_batch),
            "accept",
            expected_type=RB,
        ),
        message(
            "rollout_batch_encoding_boundaries",
            "Canonical-form edge cases: every integer width at its limits, -0.0, str8/str16, array16, "
            "map16, bin16, non-ASCII text and map keys sorted by UTF-8 bytes.",
            codec.encode_message(A, SWARM, boundaries),
            "accept",
            expected_type=RB,
        ),
        # --- rejected before the signature ------------------------------------------------------------
        message("empty", "Zero bytes.", b"", "malformed", expected_type=RC),
        message(
            "malformed_msgpack",
            "0xc1 is never used in msgpack.",
            b"\xc1\x00\x01",
            "malformed",
            expected_type=RC,
        ),
        message(
            "truncated",
            "roster_card_valid without its last 7 bytes.",
            card_bytes[:-7],
            "malformed",
            expected_type=RC,
        ),
        message(
            "trailing_bytes",
            "roster_card_valid followed by one more byte.",
            card_bytes + b"\x00",
            "malformed",
            expected_type=RC,
        ),
        message(
            "not_an_envelope",
            "A msgpack array instead of the envelope map.",
            msgpack.packb([1, 2, 3]),
            "malformed",
            expected_type=None,
        ),
        message(
            "oversize_record",
            "A signed roster card of more than MAX_RECORD_BYTES (8 KiB).",
            big,
            "oversize",
            expected_type=RC,
        ),
        message(
            "oversize_record_any_type",
            "The same, decoded without an expected type: the per-type cap applies once the type is known.",
            big,
            "oversize",
            expected_type=None,
        ),
        message(
            "wrong_version",
            "Envelope version 2 (a future major version).",
            sign_raw(A, RC, SWARM, card.to_body(), version=2),
            "bad_version",
            expected_type=RC,
        ),
        message(
            "unknown_type",
            "A message type v1 does not know.",
            sign_raw(A, "gossip", SWARM, card.to_body()),
            "unknown_type",
            expected_type=None,
        ),
        message(
            "wrong_type",
            "A valid announcement where a roster card is expected.",
            ann_bytes,
            "wrong_type",
            expected_type=RC,
        ),
        message(
            "non_canonical_key_order",
            "Body map keys in field order, not sorted; the signature is over the canonical body.",
            non_canonical_order,
            "non_canonical",
            expected_type=RC,
        ),
        message(
            "non_canonical_float32",
            "The timestamp packed as float32 instead of float64.",
            f32_env,
            "non_canonical",
            expected_type=RC,
        ),
        # --- signature and identity -------------------------------------------------------------------
        message(
            "forged_signature",
            "roster_card_valid with the signature of another key over the same bytes.",
            bytes(forged),
            "bad_signature",
            expected_type=RC,
        ),
        message(
            "tampered_completion",
            "rollout_batch_valid_logprobs with one completion character changed after signing.",
            bytes(flipped),
            "bad_signature",
            expected_type=RB,
        ),
        message(
            "small_order_key",
            "The neutral point as public key with an S = 0 signature (valid for any message "
            "under cofactorless verification): refused.",
            small,
            "bad_signature",
            expected_type=RC,
        ),
        message(
            "peer_id_mismatch",
            "Signed by key A, body claims the peer id of key B.",
            sign_raw(A, RC, SWARM, with_body(card, peer_id=B.peer_id)),
            "peer_id_mismatch",
            expected_type=RC,
        ),
        message(
            "wrong_sender",
            "Valid, but the caller expected it from another peer (stream peer / DHT subkey).",
            card_bytes,
            "wrong_sender",
            expected_type=RC,
            expected_peer_id=B.peer_id,
        ),
        message(
            "wrong_swarm",
            "Validly signed for swarm 'other-swarm'.",
            codec.encode_message(A, "other-swarm", roster_card(swarm_id="other-swarm")),
            "wrong_swarm",
            expected_type=RC,
        ),
        # --- field checks (validly signed) ------------------------------------------------------------
        message(
            "missing_field",
            "A roster card without 'seq'.",
            sign_raw(A, RC, SWARM, with_body(card, drop="seq")),
            "missing_field",
            expected_type=RC,
        ),
        message(
            "wrong_field_type",
            "'round' as a string.",
            sign_raw(A, RC, SWARM, with_body(card, round="42")),
            "bad_field",
            expected_type=RC,
        ),
        message(
            "offline_not_boolean",
            "A roster card with 'offline' = 1 (must be a boolean).",
            sign_raw(A, RC, SWARM, with_body(card, offline=1)),
            "bad_field",
            expected_type=RC,
        ),
        message(
            "work_nonce_wrong_length",
            f"A roster card with a 7-byte 'work_nonce' (must be bin({work.NONCE_BYTES})).",
            sign_raw(A, RC, SWARM, with_body(card, work_nonce=bytes(7))),
            "bad_field",
            expected_type=RC,
        ),
        message(
            "announcement_work_nonce_wrong_length",
            f"An announcement with a 7-byte 'work_nonce' (must be bin({work.NONCE_BYTES})).",
            sign_raw(A, BA, SWARM, with_body(announcement(batch_bytes, batch), work_nonce=bytes(7))),
            "bad_field",
            expected_type=BA,
        ),
        message(
            "integer_timestamp",
            "'timestamp' as an integer (must be float64).",
            sign_raw(A, RC, SWARM, with_body(card, timestamp=1767225600)),
            "bad_field",
            expected_type=RC,
        ),
        message(
            "too_many_groups",
            f"{limits.MAX_GROUPS_PER_BATCH + 1} groups (limit {limits.MAX_GROUPS_PER_BATCH}).",
            sign_raw(A, RB, SWARM, too_many.to_body()),
            "over_limit",
            expected_type=RB,
        ),
        message(
            "logprobs_length_mismatch",
            "3 log-probs for n_tokens = 4.",
            sign_raw(A, RB, SWARM, mismatch_lp),
            "bad_field",
            expected_type=RB,
        ),
        message(
            "nan_claimed_reward",
            "A NaN claimed reward.",
            sign_raw(A, RB, SWARM, nan_reward),
            "bad_field",
            expected_type=RB,
        ),
        # --- stream framing ----------------------------------------------------------------------------
        frame_header(
            "frame_header_valid", "A 1024-byte response body follows.", (1024).to_bytes(4, "big"), "accept"
        ),
        frame_header(
            "frame_header_not_found", "Length 0: the peer does not have that payload.", bytes(4), "accept"
        ),
        frame_header(
            "frame_header_oversize",
            "MAX_FRAME_BYTES + 1: rejected before reading the body.",
            (limits.MAX_FRAME_BYTES + 1).to_bytes(4, "big"),
            "oversize",
        ),
        frame_header(
            "frame_header_short", "Three bytes: the stream ended inside the header.", bytes(3), "malformed"
        ),
    ]


def render(vector: dict[str, Any]) -> str:
    return json.dumps(vector, indent=2, ensure_ascii=True) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    wanted = {f"{v['name']}.json": render(v) for v in build_vectors()}
    present = {p.name: p.read_text() for p in VECTOR_DIR.glob("*.json")} if VECTOR_DIR.exists() else {}
    if check:
        bad = sorted(n for n in wanted.keys() | present.keys() if wanted.get(n) != present.get(n))
        for name in bad:
            print(f"differs: {VECTOR_DIR / name}", file=sys.stderr)
        return 1 if bad else 0
    VECTOR_DIR.mkdir(parents=True, exist_ok=True)
    for name in present.keys() - wanted.keys():
        (VECTOR_DIR / name).unlink()
    for name, text in wanted.items():
        (VECTOR_DIR / name).write_text(text)
    print(f"wrote {len(wanted)} vectors to {VECTOR_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
