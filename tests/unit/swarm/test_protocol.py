"""The wire protocol: committed test vectors, canonical round trips, and hostile input."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.identity import Identity, public_key_from_peer_id
from swarmnode.rollouts import Completion, Provenance, RolloutGroup, TaskRef
from swarmnode.swarm.wire import codec, convert, framing, limits, protocol, work
from swarmnode.swarm.wire import dht_rules as dht
from tests.helpers.cards import roster_card

ROOT = Path(__file__).resolve().parents[3]
VECTOR_DIR = ROOT / "protocol" / "vectors" / "v1"
VECTOR_FILES = sorted(VECTOR_DIR.glob("*.json"))
SWARM = "unit-swarm"
ME = Identity.from_seed(bytes(range(32)))
OTHER = Identity.from_seed(bytes(range(1, 33)))
FAST = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def load_make_vectors():
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "protocol" / "make_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def card(**changes) -> protocol.RosterCard:
    return roster_card(ME, SWARM, **changes)


def batch(
    n_groups: int = 2, n_completions: int = 3, text: str = "<answer>4</answer>", **changes
) -> protocol.RolloutBatch:
    groups = tuple(
        protocol.WireGroup(
            task=protocol.WireTask("basic_arithmetic", {"min_terms": 2, "ops": ["+"]}, seed=7, index=i),
            completions=tuple(
                protocol.WireCompletion(text=text, n_tokens=2, logprobs=(-0.25, -1.5), token_ids=(5, 9))
                for _ in range(n_completions)
            ),
            claimed_rewards=tuple(float(j % 2) for j in range(n_completions)),
        )
        for i in range(n_groups)
    )
    fields = dict(
        peer_id=ME.peer_id,
        swarm_id=SWARM,
        round=5,
        policy_version=3,
        model_name="tiny-llama",
        tokenizer_fingerprint="ab" * 32,
        timestamp=1767225600.5,
        seq=10,
        groups=groups,
    )
    return protocol.RolloutBatch(**{**fields, **changes})


def reject_reason(data: bytes, **kwargs) -> str:
    kwargs.setdefault("swarm_id", SWARM)
    with pytest.raises(limits.ProtocolError) as info:
        codec.decode_message(data, **kwargs)
    assert info.value.reason in limits.REJECT_REASONS
    return info.value.reason


# --- test vectors --------------------------------------------------------------------------------


def test_record_vectors_cover_every_storage_rule():
    verdicts = {json.loads(p.read_text())["verdict"] for p in VECTOR_FILES if p.stem.startswith("record_")}
    assert set(dht.RECORD_REJECT_REASONS) | {"stale", "wrong_sender", "accept"} <= verdicts


def test_vectors_exist_and_cover_every_decoder_reason():
    assert len(VECTOR_FILES) >= 30
    verdicts = {json.loads(p.read_text())["verdict"] for p in VECTOR_FILES}
    decoder_reasons = set(limits.REJECT_REASONS) - {"stale", "replay", "hash_mismatch"}
    assert decoder_reasons <= verdicts, decoder_reasons - verdicts  # every decoder reason has a vector
    assert "accept" in verdicts


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_vector(path):
    v = json.loads(path.read_text())
    assert v["name"] == path.stem
    if v["kind"] == "identity_work":  # PROTOCOL.md section 2, "Identity work"
        public_key, nonce = bytes.fromhex(v["public_key"]), bytes.fromhex(v["nonce"])
        assert Identity.from_seed(bytes.fromhex(v["signer_seed"])).public_key == public_key
        assert work.work_digest(public_key, nonce).hex() == v["digest"]
        assert work.leading_zero_bits(bytes.fromhex(v["digest"])) == v["leading_zero_bits"]
        enough = work.has_work(public_key, nonce, v["bits"])
        assert v["verdict"] == ("accept" if enough else "no_identity_work")
        return
    data = bytes.fromhex(v["hex"])
    if v["kind"] == "frame_header":
        if v["verdict"] == "accept":
            assert framing.parse_frame_header(data) == v["length"]
            assert framing.encode_frame_header(v["length"]) == data
        else:
            with pytest.raises(limits.ProtocolError) as info:
                framing.parse_frame_header(data)
            assert info.value.reason == v["verdict"]
        return
    if v["kind"] == "dht_record":  # PROTOCOL.md section 8: what a storing node keeps
        subkey, value = msgpack.packb(v["subkey"]), msgpack.packb(data, use_bin_type=True)
        verdict = dht.check_record(dht.key_id(v["key"]), subkey, value, v["expiration"], v["now"])
        assert (verdict or "accept") == v["verdict"]
        return
    if v["kind"] == "dht_work":  # PROTOCOL.md section 8: how a storing node ranks it by identity work
        msg, signer = codec.decode_message(data, swarm_id=None, expected_peer_id=v["subkey"])
        digest = work.work_digest(public_key_from_peer_id(signer), msg.work_nonce)
        proven = work.leading_zero_bits(digest) if msg.work_nonce else 0
        read = dht.record_work(msgpack.packb(data, use_bin_type=True))
        assert read.work_bits == v["work_bits"] == proven
        assert dht.work_verdict(read, v["bits"], home=v["home"]) == v["verdict"]
        return
    kwargs = dict(swarm_id=v["swarm_id"], expected_type=v["type"], expected_peer_id=v["expected_peer_id"])
    if v["verdict"] != "accept":
        assert reject_reason(data, **kwargs) == v["verdict"]
        return
    msg, sender = codec.decode_message(data, **kwargs)
    assert sender == v["sender_peer_id"] == msg.peer_id
    signer = Identity.from_seed(bytes.fromhex(v["signer_seed"]))
    assert codec.encode_message(signer, v["swarm_id"], msg) == data  # canonical: byte for byte
    assert load_make_vectors().body_json(msg.to_body()) == v["body"]


def test_stored_work_vectors_cover_every_verdict():
    verdicts = {
        json.loads(p.read_text())["verdict"] for p in VECTOR_FILES if p.stem.startswith("stored_work_")
    }
    assert verdicts == {dht.WITH_WORK, dht.WITHOUT_WORK, dht.NO_IDENTITY_WORK}


def test_make_vectors_regenerates_the_committed_files():
    mv = load_make_vectors()
    wanted = {f"{v['name']}.json": mv.render(v) for v in mv.build_vectors()}
    present = {p.name: p.read_text() for p in VECTOR_FILES}
    assert wanted.keys() == present.keys()
    for name in wanted:
        assert wanted[name] == present[name], f"{name} differs: run python protocol/make_vectors.py"


# --- round trips -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "msg",
    [
        card(),
        card(addrs=(), tokenizer_fingerprint="", protocol_version=2, extra={"zzz": [1, {"a": b"\x00"}]}),
        batch(),
        batch(n_groups=1, n_completions=1, text=""),
    ],
    ids=["card", "card_edge", "batch", "batch_min"],
)
def test_encode_decode_roundtrip(msg):
    data = codec.encode_message(ME, SWARM, msg)
    decoded, sender = codec.decode_message(
        data, swarm_id=SWARM, expected_type=msg.TYPE, expected_peer_id=ME.peer_id
    )
    assert sender == ME.peer_id
    assert decoded == msg
    assert codec.encode_message(ME, SWARM, decoded) == data


def test_announcement_and_payload_check():
    b = batch()
    data = codec.encode_message(ME, SWARM, b)
    ann = protocol.announcement_for(b, data, timestamp=b.timestamp, seq=11)
    ann_bytes = codec.encode_message(ME, SWARM, ann)
    assert len(ann_bytes) <= limits.MAX_RECORD_BYTES
    decoded_ann, _ = codec.decode_message(ann_bytes, swarm_id=SWARM, expected_type=limits.BATCH_ANNOUNCEMENT)
    assert codec.check_payload(decoded_ann, data, swarm_id=SWARM) == b
    with pytest.raises(limits.ProtocolError, match="hash_mismatch"):
        codec.check_payload(decoded_ann, data[:-1] + bytes([data[-1] ^ 1]), swarm_id=SWARM)
    # a correctly hashed payload that disagrees with its own announcement
    other = replace(b, round=6)
    other_bytes = codec.encode_message(ME, SWARM, other)
    lying = replace(
        decoded_ann, payload_sha256=limits.payload_digest(other_bytes), payload_len=len(other_bytes)
    )
    with pytest.raises(limits.ProtocolError) as info:
        codec.check_payload(lying, other_bytes, swarm_id=SWARM)
    assert info.value.reason == "bad_field"
    # a payload signed by someone else than the announcer
    theirs = codec.encode_message(OTHER, SWARM, replace(b, peer_id=OTHER.peer_id))
    forwarded = replace(decoded_ann, payload_sha256=limits.payload_digest(theirs), payload_len=len(theirs))
    with pytest.raises(limits.ProtocolError) as info:
        codec.check_payload(forwarded, theirs, swarm_id=SWARM)
    assert info.value.reason == "wrong_sender"


def test_conversions_from_and_to_rollout_types():
    ref = TaskRef.make(
        "basic_arithmetic", seed=11, index=3, config={"max_terms": 4, "ops": ["+", "*"], "p": 0.5}
    )
    completions = (
        Completion(
            text="<answer>12</answer>", token_ids=(1, 2, 3), logprobs=(-0.1, -0.2, -0.3), finished=True
        ),
        Completion(text="I think 13", token_ids=(4, 5), logprobs=None, finished=False),
    )
    group = RolloutGroup(
        ref=ref,
        question="What is 5 + 7?",
        completions=completions,
        rewards=(1.1, 0.0),
        task_scores=(1.0, 0.0),
        format_ok=(True, False),
        provenance=Provenance(source="local", producer=ME.peer_id, policy_version=3, round=5),
    )
    b = convert.make_rollout_batch(
        [group],
        peer_id=ME.peer_id,
        swarm_id=SWARM,
        round=5,
        policy_version=3,
        model_name="tiny-llama",
        tokenizer_fingerprint="cd" * 32,
        timestamp=1767225600,
        seq=1,
    )
    data = codec.encode_message(ME, SWARM, b)
    assert b"What is 5 + 7?" not in data  # no question text on the wire
    decoded, _ = codec.decode_message(data, swarm_id=SWARM)
    assert decoded == b  # logprobs were rounded to float32 when the batch was made
    # what the receiver (verify.Verifier.check_batch) reads back from it
    [wire] = decoded.groups
    received_ref = convert.task_from_wire(wire.task)
    assert received_ref == ref and received_ref.key() == ref.key()
    assert wire.claimed_rewards == (1.0, 0.0)  # task scores, not the format-shaped rewards
    assert convert.batch_provenance(decoded) == Provenance(
        source="peer",
        producer=ME.peer_id,
        policy_version=3,
        round=5,
        model_name="tiny-llama",
        tokenizer_fingerprint="cd" * 32,
    )
    first, second = (convert.completion_from_wire(c) for c in wire.completions)
    assert first.text == completions[0].text and first.token_ids == (1, 2, 3) and first.finished
    assert first.logprobs == tuple(
        struct.unpack("<3f", struct.pack("<3f", -0.1, -0.2, -0.3))
    )  # float32 on the wire
    assert second.token_ids == (4, 5) and second.logprobs is None and not second.finished
    # without log-probs
    b2 = convert.make_rollout_batch(
        [group],
        peer_id=ME.peer_id,
        swarm_id=SWARM,
        round=5,
        policy_version=3,
        model_name="m",
        tokenizer_fingerprint="",
        timestamp=1.0,
        seq=2,
        include_logprobs=False,
    )
    assert all(c.logprobs is None for g in b2.groups for c in g.completions)


# --- limits and field checks ------------------------------------------------------------------------


def test_encoder_refuses_what_peers_would_reject():
    with pytest.raises(limits.ProtocolError) as info:
        codec.encode_message(ME, SWARM, batch(n_groups=limits.MAX_GROUPS_PER_BATCH + 1, n_completions=1))
    assert info.value.reason == "over_limit"
    with pytest.raises(limits.ProtocolError) as info:
        codec.encode_message(ME, SWARM, batch(n_groups=1, text="x" * (limits.MAX_COMPLETION_TEXT_BYTES + 1)))
    assert info.value.reason == "over_limit"
    with pytest.raises(limits.ProtocolError) as info:  # every field within limits, the whole over 4 MiB
        codec.encode_message(
            ME, SWARM, batch(n_groups=6, n_completions=64, text="y" * limits.MAX_COMPLETION_TEXT_BYTES)
        )
    assert info.value.reason == "oversize"
    with pytest.raises(limits.ProtocolError) as info:
        codec.encode_message(ME, SWARM, card(addrs=("not-a-multiaddr",)))
    assert info.value.reason == "bad_field"
    with pytest.raises(limits.ProtocolError) as info:
        codec.encode_message(ME, SWARM, card(timestamp=math.inf))
    assert info.value.reason == "bad_field"
    with pytest.raises(ValueError):
        codec.encode_message(ME, SWARM, card(peer_id=OTHER.peer_id))
    with pytest.raises(ValueError):
        codec.encode_message(ME, "another-swarm", card())


def test_largest_legal_roster_card_fits_a_dht_record():
    big = card(
        peer_id=ME.peer_id,
        model_name="m" * limits.MAX_NAME_BYTES,
        tokenizer_fingerprint="f" * limits.MAX_FINGERPRINT_CHARS,
        addrs=tuple("/" + "a" * (limits.MAX_ADDR_BYTES - 1) for _ in range(limits.MAX_ADDRS)),
        swarm_id="s" * limits.MAX_SWARM_ID_BYTES,
        policy_version=2**63 - 1,
        round=2**63 - 1,
        seq=2**63 - 1,
    )
    assert len(codec.encode_message(ME, "s" * limits.MAX_SWARM_ID_BYTES, big)) <= limits.MAX_RECORD_BYTES


def signed(body: dict, msg_type: str = limits.ROSTER_CARD, identity: Identity = ME) -> bytes:
    """Sign any body, valid or not, as its peer would."""
    body_bytes = codec.canonical_packb(body)
    swarm = body["swarm_id"] if isinstance(body.get("swarm_id"), str) else SWARM
    sig = identity.sign(codec.signing_bytes(msg_type, swarm, body_bytes))
    return codec.pack_envelope(msg_type, body_bytes, identity.public_key, sig)


@pytest.mark.parametrize(
    "field, value, reason",
    [
        ("round", -1, "bad_field"),
        ("round", 2**63, "bad_field"),
        ("round", True, "bad_field"),
        ("round", 1.0, "bad_field"),
        ("seq", None, "bad_field"),
        ("timestamp", -1.0, "bad_field"),
        ("model_name", "", "bad_field"),
        ("model_name", "a\nb", "bad_field"),
        ("model_name", "m" * (limits.MAX_NAME_BYTES + 1), "over_limit"),
        ("tokenizer_fingerprint", "ABCD", "bad_field"),
        ("addrs", "/ip4/1.2.3.4", "bad_field"),
        ("addrs", ["/x"] * (limits.MAX_ADDRS + 1), "over_limit"),
        ("addrs", ["/has space"], "bad_field"),
        ("protocol_version", 0, "bad_field"),
        ("swarm_id", 5, "bad_field"),
        ("peer_id", b"bytes", "bad_field"),
    ],
)
def test_roster_field_checks(field, value, reason):
    body = card().to_body()
    body[field] = value
    assert reject_reason(signed(body)) == reason


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda b: b["groups"].clear(), "bad_field"),
        (lambda b: b["groups"][0]["completions"].clear(), "bad_field"),
        (lambda b: b["groups"][0]["claimed_rewards"].pop(), "bad_field"),
        (lambda b: b["groups"][0]["claimed_rewards"].__setitem__(0, 1), "bad_field"),
        (
            lambda b: b["groups"][0]["completions"][0].__setitem__(
                "n_tokens", limits.MAX_COMPLETION_TOKENS + 1
            ),
            "over_limit",
        ),
        (
            lambda b: b["groups"][0]["completions"][0].__setitem__(
                "logprobs", struct.pack("<2f", 0.0, math.nan)
            ),
            "bad_field",
        ),
        (lambda b: b["groups"][0]["completions"][0].__setitem__("token_ids", [5, 9]), "bad_field"),
        (lambda b: b["groups"][0]["completions"][0].__setitem__("finished", 1), "bad_field"),
        (lambda b: b["groups"][0]["completions"][0].pop("text"), "missing_field"),
        (lambda b: b["groups"][0]["task"].__setitem__("dataset", "no spaces allowed"), "bad_field"),
        (lambda b: b["groups"][0]["task"].__setitem__("index", -1), "bad_field"),
        (lambda b: b["groups"][0]["task"]["config"].__setitem__("blob", b"\x00"), "bad_field"),
        (lambda b: b["groups"][0]["task"]["config"].__setitem__("x", [[[["deep"]]]]), "over_limit"),
        (
            lambda b: b["groups"][0]["task"]["config"].__setitem__(
                "x", list(range(limits.MAX_CONFIG_LIST + 1))
            ),
            "over_limit",
        ),
        (lambda b: b["groups"][0]["task"]["config"].__setitem__("x", math.inf), "bad_field"),
        (lambda b: b["groups"][0].pop("task"), "missing_field"),
    ],
)
def test_batch_field_checks(mutate, reason):
    body = batch().to_body()
    mutate(body)
    assert reject_reason(signed(body, limits.ROLLOUT_BATCH)) == reason


def test_decoder_hard_limits_are_malformed():
    deep: list = []
    for _ in range(limits.MAX_NESTING + 2):
        deep = [deep]
    body = card(extra={"deep": deep}).to_body()
    env = {"b": body, "k": ME.public_key, "s": bytes(64), "t": limits.ROSTER_CARD, "v": 1}
    assert reject_reason(msgpack.packb(env, use_bin_type=True)) == "malformed"
    nested = msgpack.packb({"v": 1, "b": [[]] * (limits.UNPACK_MAX_ARRAY_LEN + 1)})
    assert reject_reason(nested) == "malformed"
    many = msgpack.packb({"v": 1, "x": [[[]] * 1000] * 17})  # 17 001 containers
    assert reject_reason(many) == "malformed"
    assert reject_reason(b"\x85" + b"\xa1v\x01" * 5) == "malformed"  # duplicate keys
    timestamp_ext = msgpack.packb({"v": 1, "t": msgpack.Timestamp(1, 0)}, datetime=False)
    assert reject_reason(timestamp_ext) == "malformed"


def test_stream_framing():
    assert framing.encode_frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert framing.parse_frame_header(b"\x00\x00\x00\x03") == 3
    assert (
        framing.parse_frame_header(framing.encode_frame_header(limits.MAX_FRAME_BYTES))
        == limits.MAX_FRAME_BYTES
    )
    with pytest.raises(limits.ProtocolError, match="oversize"):
        framing.encode_frame(b"x" * (limits.MAX_FRAME_BYTES + 1))
    with pytest.raises(limits.ProtocolError, match="oversize"):
        framing.parse_frame_header(b"\xff\xff\xff\xff")
    with pytest.raises(limits.ProtocolError, match="oversize"):
        framing.parse_frame_header(b"\x00\x00\x01\x00", max_bytes=255)
    digest = limits.payload_digest(b"payload")
    assert framing.parse_pull_request(framing.encode_pull_request(digest)) == digest
    with pytest.raises(limits.ProtocolError, match="malformed"):
        framing.parse_pull_request(digest[:31])


def test_dht_layout_and_freshness():
    peer = ME.peer_id
    shard = dht.roster_shard(peer)
    assert 0 <= shard < dht.ROSTER_SHARDS
    assert dht.roster_key("demo-1", peer) == f"swarmnode/demo-1/roster/{shard}"
    assert dht.roster_keys("demo-1") == [f"swarmnode/demo-1/roster/{i}" for i in range(dht.ROSTER_SHARDS)]
    assert dht.announce_key("demo-1", peer) == f"swarmnode/demo-1/announce/{peer}"
    assert dht.roster_ttl_s(10.0) == 20.0 and dht.announce_ttl_s(30.0) == 90.0
    for bad in ("", "has/slash", "-dash-first", "x" * 65, "spa ce"):
        with pytest.raises(ValueError, match="swarm id"):
            dht.roster_key(bad, peer)
    with pytest.raises(ValueError, match="swarm id"):
        dht.announce_key("has/slash", peer)
    limits.check_fresh(100.0, now=129.0)
    limits.check_fresh(100.0, now=71.0)
    for ts in (131.0, 69.0, math.nan, math.inf):
        with pytest.raises(limits.ProtocolError, match="stale"):
            limits.check_fresh(ts, now=100.0)
    limits.check_fresh(100.0, now=100.0 + 60.0 + 30.0, max_age=60.0)  # a DHT record up to its TTL old
    with pytest.raises(limits.ProtocolError, match="stale"):
        limits.check_fresh(100.0, now=100.0 + 60.0 + 31.0, max_age=60.0)
    with pytest.raises(limits.ProtocolError, match="stale"):
        limits.check_fresh(131.0, now=100.0, max_age=60.0)  # the future bound does not move


def test_protocol_error_reasons_are_metric_labels():
    assert len(set(limits.REJECT_REASONS)) == len(limits.REJECT_REASONS)
    assert all(r.replace("_", "").isalpha() and r == r.lower() for r in limits.REJECT_REASONS)
    with pytest.raises(ValueError):
        limits.ProtocolError("not_a_reason")


# --- hostile input (hypothesis) ----------------------------------------------------------------------

VALID = [
    codec.encode_message(ME, SWARM, card()),
    codec.encode_message(ME, SWARM, batch(n_groups=1, n_completions=2)),
]

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=70),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)


def decode_or_reason(data: bytes) -> str:
    try:
        codec.decode_message(data, swarm_id=SWARM)
    except limits.ProtocolError as e:
        assert e.reason in limits.REJECT_REASONS
        return e.reason
    return "accept"


@FAST
@given(st.binary(max_size=600))
def test_arbitrary_bytes_only_raise_protocol_error(data):
    decode_or_reason(data)


@FAST
@given(msgpack_values, st.sampled_from([*limits.MESSAGE_TYPES, "x"]), st.binary(min_size=32, max_size=32))
def test_arbitrary_envelopes_only_raise_protocol_error(body, msg_type, key):
    env = {"v": 1, "t": msg_type, "b": body, "k": key, "s": bytes(64)}
    assert decode_or_reason(msgpack.packb(env, use_bin_type=True)) != "accept"
    if isinstance(body, dict):  # correctly signed by the peer it names: reaches the field checks
        body.update(swarm_id=SWARM, peer_id=ME.peer_id)
        assert decode_or_reason(signed(body, msg_type)) != "accept"


@FAST
@given(st.sampled_from(VALID), st.data())
def test_mutations_of_valid_messages_are_rejected(valid, data):
    kind = data.draw(st.sampled_from(["flip", "delete", "insert", "truncate", "extend"]))
    pos = data.draw(st.integers(0, len(valid) - 1))
    if kind == "flip":
        mutated = valid[:pos] + bytes([valid[pos] ^ data.draw(st.integers(1, 255))]) + valid[pos + 1 :]
    elif kind == "delete":
        mutated = valid[:pos] + valid[pos + data.draw(st.integers(1, 8)) :]
    elif kind == "insert":
        mutated = valid[:pos] + data.draw(st.binary(min_size=1, max_size=8)) + valid[pos:]
    elif kind == "truncate":
        mutated = valid[:pos]
    else:
        mutated = valid + data.draw(st.binary(min_size=1, max_size=8))
    assert decode_or_reason(mutated) != "accept"


names = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40)
u63 = st.integers(0, 2**63 - 1)
cards = st.builds(
    card,
    model_name=names,
    tokenizer_fingerprint=st.text("0123456789abcdef", max_size=64),
    policy_version=u63,
    round=u63,
    seq=u63,
    timestamp=st.floats(0, 1e12, allow_nan=False),
    addrs=st.lists(
        st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40), max_size=4
    ).map(lambda xs: tuple("/" + x for x in xs)),
)
completions = st.builds(
    lambda text, n, lp, finished: protocol.WireCompletion(
        text=text,
        n_tokens=n,
        finished=finished,
        logprobs=tuple(struct.unpack(f"<{n}f", struct.pack(f"<{n}f", *([lp] * n))))
        if lp is not None
        else None,
        token_ids=tuple(range(n)) if lp is not None else None,
    ),
    st.text(max_size=200),
    st.integers(0, 40),
    st.none() | st.floats(-50, 0, allow_nan=False, width=32),
    st.booleans(),
)
groups = st.builds(
    lambda task_config, comps, rewards: protocol.WireGroup(
        task=protocol.WireTask("basic_arithmetic", task_config, seed=1, index=2),
        completions=tuple(comps),
        claimed_rewards=tuple(rewards[: len(comps)]) + (0.0,) * (len(comps) - len(rewards)),
    ),
    st.dictionaries(
        st.text(min_size=1, max_size=10),
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=30)
        | st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
        max_size=10,
    ),
    st.lists(completions, min_size=1, max_size=4),
    st.lists(st.floats(-10, 10, allow_nan=False), max_size=4),
)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(cards, st.lists(groups, min_size=1, max_size=3).map(lambda gs: batch(groups=tuple(gs)))))
def test_valid_messages_roundtrip_byte_for_byte(msg):
    data = codec.encode_message(ME, SWARM, msg)
    decoded, sender = codec.decode_message(data, swarm_id=SWARM, expected_type=msg.TYPE)
    assert decoded == msg and sender == ME.peer_id
    assert codec.encode_message(ME, SWARM, decoded) == data
