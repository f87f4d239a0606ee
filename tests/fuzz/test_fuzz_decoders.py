"""Fuzzing every decoder of bytes that come from the network: the message decoder, the stream frame
header, the pull request, and the identity parsers (key files, peer ids).

Properties: nothing but the documented error escapes (``ProtocolError`` with a reason from
``REJECT_REASONS``; ``ValueError`` for key files); whatever is accepted is exactly what a key holder
signed (byte mutants: one of the accepted test vectors; signed mutants: it re-encodes byte for byte);
decoding costs bounded memory and time. Seeds: every vector in ``protocol/vectors/v1``.
"""

from __future__ import annotations

import time
import tracemalloc

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.identity import Identity, peer_id_from_public_key, public_key_from_peer_id
from swarmnode.swarm.wire import codec, framing, limits, protocol
from tests.helpers.mutations import (
    ACCEPTED,
    FRAME_SEEDS,
    MESSAGE_SEEDS,
    SIGNER_SEED,
    STRUCTURE_SEEDS,
    byte_mutant,
    fuzz_settings,
    note,
    sign_body,
    structural_mutant,
)

SWARM = "vector-swarm"  # the test vectors' swarm
SIGNER = Identity.from_seed(SIGNER_SEED)  # the vectors' honest sender: the peer id the seed bodies name
MiB = 1024 * 1024


def decode(data: bytes, expected_type: str | None = None) -> tuple[str, protocol.Message | None]:
    """(verdict, message): "accept" or the reject reason. Any other exception fails the test."""
    try:
        msg, sender = codec.decode_message(data, swarm_id=SWARM, expected_type=expected_type)
    except limits.ProtocolError as exc:
        assert exc.reason in limits.REJECT_REASONS, exc
        note(f"reject: {exc.reason}")
        return exc.reason, None
    assert sender == msg.peer_id
    note("accept")
    return "accept", msg


def test_the_seeds_are_the_protocol_vectors():
    assert len(MESSAGE_SEEDS) >= 30 and len(FRAME_SEEDS) >= 4 and len(ACCEPTED) >= 5
    assert len(STRUCTURE_SEEDS) >= 20
    assert codec.encode_message(SIGNER, SWARM, decode(min(ACCEPTED, key=len))[1]) == min(ACCEPTED, key=len)


@fuzz_settings(scale=3)
@given(byte_mutant(MESSAGE_SEEDS), st.sampled_from([None, *limits.MESSAGE_TYPES]))
def test_byte_mutants_are_rejected_with_a_reason(data, expected_type):
    verdict, _ = decode(data, expected_type)
    if verdict == "accept":  # only bytes a key holder signed get through: an accepted vector, unchanged
        assert data in ACCEPTED


signed_mutants = st.sampled_from(STRUCTURE_SEEDS).flatmap(
    lambda seed: st.tuples(
        st.sampled_from([seed[0]] * 6 + list(limits.MESSAGE_TYPES)), structural_mutant(seed[1])
    )
)


@fuzz_settings()
@given(signed_mutants)
def test_signed_structural_mutants_are_rejected_or_reencode_exactly(mutant):
    msg_type, body = mutant
    data = sign_body(SIGNER, msg_type, body, SWARM)
    verdict, msg = decode(data)
    if verdict == "accept":  # a message that passes every check is canonical and within every limit
        assert codec.encode_message(SIGNER, SWARM, msg) == data
        assert len(data) <= type(msg).MAX_BYTES


@fuzz_settings(scale=0.3)
@given(signed_mutants)
def test_decoding_memory_is_proportional_to_the_input(mutant):
    """tracemalloc peak while decoding, against the input size (decoded objects, canonical re-encoding)."""
    data = sign_body(SIGNER, *mutant, SWARM)
    tracemalloc.start()
    try:
        decode(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 64 * len(data) + 256 * 1024, (peak, len(data))


def _array32(items: list[bytes]) -> bytes:
    return b"\xdd" + len(items).to_bytes(4, "big") + b"".join(items)


def _max_valid_batch() -> bytes:
    """A valid batch just under MAX_FRAME_BYTES: 64 groups x 64 completions of ~900 bytes."""
    completion = protocol.WireCompletion(
        text="é" * 445, n_tokens=8, logprobs=(-1.0,) * 8, token_ids=tuple(range(8))
    )
    group = protocol.WireGroup(
        task=protocol.WireTask("basic_arithmetic", {"min_terms": 2}, seed=1, index=2),
        completions=(completion,) * 64,
        claimed_rewards=(0.0,) * 64,
    )
    batch = protocol.RolloutBatch(
        peer_id=SIGNER.peer_id, swarm_id=SWARM, round=1, policy_version=1, model_name="m",
        tokenizer_fingerprint="", timestamp=1.0, seq=1, groups=(group,) * 64,
    )  # fmt: skip
    return codec.encode_message(SIGNER, SWARM, batch)


WORST_CASES = {
    # the biggest valid message: every field parsed, signature checked, canonical form re-encoded
    "max_valid_batch": _max_valid_batch,
    # ~460 000 float64 in 1024-item arrays: the most decoded objects per byte that pass the parser
    "floats": lambda: b"\x82\xa1v\x01\xa1b" + _array32([_array32([b"\xcb" + bytes(8)] * 1024)] * 450),
    # 16 384 containers, then one more: the container cap
    "containers": lambda: b"\x82\xa1v\x01\xa1b" + _array32([_array32([b"\x90"] * 1023)] * 17),
    # 256 strings of 16 KiB (the per-string cap), in a valid-looking envelope
    "strings": lambda: b"\x82\xa1v\x01\xa1b" + _array32([b"\xda\x40\x00" + b"a" * 16384] * 255),
    # a 4 GiB array announced in 5 bytes
    "huge_length_prefix": lambda: b"\x82\xa1v\x01\xa1b\xdd\xff\xff\xff\xff",
    # 16 levels of nesting past MAX_NESTING
    "deep": lambda: b"\x82\xa1v\x01\xa1b" + b"\x91" * 40 + b"\xc0",
}


@pytest.mark.parametrize("name", list(WORST_CASES))
def test_worst_case_inputs_cost_bounded_memory_and_time(name, record_property):
    data = WORST_CASES[name]()[: limits.MAX_FRAME_BYTES]
    tracemalloc.start()
    try:
        decode(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    started = time.perf_counter()  # timed without tracemalloc, which slows allocation down a lot
    decode(data)
    seconds = time.perf_counter() - started
    record_property("peak_mib", round(peak / MiB, 1))
    record_property("seconds", round(seconds, 2))
    print(f"\n{name}: {len(data)} bytes, peak {peak / MiB:.1f} MiB, {seconds:.2f} s")
    assert peak <= 64 * MiB, peak  # a 4 MiB frame never costs more than 16x its size
    assert seconds <= 10.0


# --- stream framing --------------------------------------------------------------------------------


@fuzz_settings()
@given(st.binary(max_size=8) | byte_mutant(FRAME_SEEDS), st.sampled_from([limits.MAX_FRAME_BYTES, 255, 0]))
def test_frame_headers_parse_within_the_cap_or_are_refused(header, cap):
    try:
        length = framing.parse_frame_header(header, cap)
    except limits.ProtocolError as exc:
        assert exc.reason in {"malformed", "oversize"}
        return
    assert 0 <= length <= cap and framing.encode_frame_header(length, cap) == header


@fuzz_settings()
@given(st.binary(max_size=64))
def test_pull_requests_are_32_bytes_or_malformed(request_bytes):
    try:
        assert framing.parse_pull_request(request_bytes) == request_bytes and len(request_bytes) == 32
    except limits.ProtocolError as exc:
        assert exc.reason == "malformed" and len(request_bytes) != 32


# --- identities --------------------------------------------------------------------------------------

KEY_FILE = SIGNER.to_bytes()


@fuzz_settings()
@given(st.binary(max_size=100) | byte_mutant([KEY_FILE]))
def test_key_files_load_exactly_or_say_what_is_wrong(data):
    try:
        identity = Identity.from_bytes(data)
    except ValueError as exc:
        assert "swarmnode keygen --force" in str(exc)  # the message says how to fix it
        return
    assert identity.to_bytes() == data  # only a well-formed Ed25519 key file loads


@fuzz_settings()
@given(
    st.text(max_size=60)
    | st.text(alphabet="123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz", max_size=60)
    | byte_mutant([SIGNER.peer_id.encode()]).map(lambda b: b.decode("latin-1"))
)
def test_peer_ids_map_back_to_exactly_one_key(peer_id):
    key = public_key_from_peer_id(peer_id)
    if key is not None:
        assert len(key) == 32 and peer_id_from_public_key(key) == peer_id


def test_msgpack_is_never_decoded_without_limits():
    """The one msgpack decode on the network path refuses what the limits refuse (spot check of
    ``codec._unpack``; tests/unit/test_security.py checks the source for other decode calls)."""
    big = msgpack.packb({"v": 1, "b": "x" * (limits.UNPACK_MAX_STR_LEN + 1)})
    assert decode(big)[0] == "malformed"
