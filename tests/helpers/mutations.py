"""Hypothesis strategies the fuzzers share: seeds, byte-level and structure-aware mutations, re-signing.

Two kinds of mutants reach two depths of the pipeline:

- **byte mutants** (flip, insert, delete, truncate, splice two seeds, overwrite a length/type byte with an
  extreme value) exercise the msgpack parser, the hard limits, the envelope and canonical-form checks;
  almost all of them die at the signature at the latest;
- **signed structural mutants**: the seed's body is decoded, one node of its tree is changed (replaced by
  any msgpack value, a boundary value of its own type, deleted, duplicated, or given a sibling), and
  the result is signed again by a real key. They get past the signature and exercise every field check,
  and, through the verifier, task regeneration and scoring.

How many examples each fuzz test runs: ``SWARMNODE_FUZZ_EXAMPLES`` (default: the CI budget).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from swarmnode.identity import Identity
from swarmnode.swarm.wire import codec, limits

ROOT = Path(__file__).resolve().parents[2]
VECTOR_DIR = ROOT / "protocol" / "vectors" / "v1"
EXAMPLES = int(os.environ.get("SWARMNODE_FUZZ_EXAMPLES", "300"))


def fuzz_settings(scale: float = 1.0) -> settings:
    """The fuzzers' settings: ``scale`` x EXAMPLES examples, no deadline, no example database."""
    return settings(
        max_examples=max(10, int(EXAMPLES * scale)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def note(outcome: str) -> None:
    """Count an outcome in hypothesis' statistics (``--hypothesis-show-statistics``)."""
    if currently_in_test_context():
        event(outcome)


def load_vectors() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(VECTOR_DIR.glob("*.json"))]


VECTORS = load_vectors()
MESSAGE_SEEDS = [bytes.fromhex(v["hex"]) for v in VECTORS if v["kind"] == "message"]
SIGNER_SEED = bytes.fromhex(next(v["signer_seed"] for v in VECTORS if v.get("signer_seed")))
ACCEPTED = {bytes.fromhex(v["hex"]) for v in VECTORS if v["kind"] == "message" and v["verdict"] == "accept"}
FRAME_SEEDS = [bytes.fromhex(v["hex"]) for v in VECTORS if v["kind"] == "frame_header"]


def seed_envelope(data: bytes) -> dict | None:
    """The envelope of a seed as a plain msgpack map, or None when the seed is not one."""
    try:
        env = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - seeds include garbage on purpose
        return None
    if isinstance(env, dict) and isinstance(env.get("b"), dict) and isinstance(env.get("t"), str):
        return env
    return None


# Signed structural mutants start from every seed whose envelope decodes: valid messages and the
# invalid ones (wrong field types, too many groups, ...), so mutations also walk back into validity.
STRUCTURE_SEEDS = [(env["t"], env["b"]) for env in map(seed_envelope, MESSAGE_SEEDS) if env is not None]

MSGPACK_INT_MIN, MSGPACK_INT_MAX = -(2**63), 2**64 - 1
INT_EDGES = (0, 1, -1, 127, 128, 255, 256, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -(2**63))
FLOAT_EDGES = (0.0, -0.0, 1.0, -1.0, 1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf"))
STR_SIZES = (0, 1, 31, 32, 64, 65, 128, 129, 255, 256, 257, limits.MAX_COMPLETION_TEXT_BYTES)

leaves = (
    st.none()
    | st.booleans()
    | st.sampled_from(INT_EDGES)
    | st.integers(MSGPACK_INT_MIN, MSGPACK_INT_MAX)
    | st.sampled_from(FLOAT_EDGES)
    | st.floats()
    | st.text(max_size=40)
    | st.sampled_from(STR_SIZES).map(lambda n: "x" * n)
    | st.binary(max_size=80)
)
msgpack_values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=16), children, max_size=6)
    ),
    max_leaves=24,
)


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every node of a decoded msgpack tree, as a path of keys and indices."""
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, (*path, i))
    return out


def _get(tree: Any, path: tuple) -> Any:
    for step in path:
        tree = tree[step]
    return tree


def deep_copy(value: Any) -> Any:
    """A copy of a decoded msgpack tree (maps and lists copied, leaves shared: they are immutable)."""
    if isinstance(value, dict):
        return {k: deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [deep_copy(v) for v in value]
    return value


def _same_type_edge(draw, value: Any) -> Any:
    """A boundary value of the node's own type: reaches range and length checks."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        # next to the value, within what msgpack can encode at all (nobody can send more)
        near = st.integers(max(value - 2, MSGPACK_INT_MIN), min(value + 2, MSGPACK_INT_MAX))
        return draw(st.sampled_from(INT_EDGES) | near)
    if isinstance(value, float):
        return draw(st.sampled_from(FLOAT_EDGES))
    if isinstance(value, str):
        return draw(st.sampled_from(["x", "é", "\x00", "/", "A"])) * draw(st.sampled_from(STR_SIZES))
    if isinstance(value, bytes):
        return draw(st.binary(max_size=len(value) + 8) | st.just(value[:-1]) | st.just(value + b"\x00"))
    if isinstance(value, list):
        return value * draw(st.integers(0, 3)) + value[:1] * draw(st.sampled_from([0, 60, 70]))
    return draw(msgpack_values)


@st.composite
def structural_mutant(draw, body: dict) -> dict:
    """``body`` with one to three of its nodes changed (see the module docstring)."""
    body = deep_copy(body)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(body)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "edge", "delete", "add"]))
        if not path:  # the body itself: only a sibling key can be added
            action = "add"
        if action == "add":
            target = _get(body, path)
            if isinstance(target, dict):
                target[draw(st.text(max_size=12))] = draw(msgpack_values)
            elif isinstance(target, list):
                target.insert(draw(st.integers(0, len(target))), draw(msgpack_values))
            continue
        parent, last = _get(body, path[:-1]), path[-1]
        if action == "delete":
            del parent[last]
        elif action == "edge":
            parent[last] = _same_type_edge(draw, parent[last])
        else:
            parent[last] = draw(msgpack_values)
    return body


def sign_body(identity: Identity, msg_type: str, body: dict, swarm_id: str) -> bytes:
    """Sign any body as its sender would (canonical bytes when it has a canonical form)."""
    try:
        body_bytes = codec.canonical_packb(body)
    except limits.ProtocolError:  # not representable canonically (e.g. nesting): sign the plain encoding
        body_bytes = msgpack.packb(body, use_bin_type=True)
    claimed = body.get("swarm_id")
    swarm = claimed if isinstance(claimed, str) else swarm_id
    signature = identity.sign(codec.signing_bytes(msg_type, swarm, body_bytes))
    return codec.pack_envelope(msg_type, body_bytes, identity.public_key, signature)


@st.composite
def byte_mutant(draw, seeds: list[bytes]) -> bytes:
    """A seed with one to four byte-level mutations."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "splice", "extend"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:  # a type or length byte forced to an extreme
            data[pos] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xC1, 0xC4, 0xC6, 0xD4, 0xDD, 0xDF, 0xFF]))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif kind == "truncate":
            del data[pos:]
        elif kind == "splice":
            other = draw(st.sampled_from(seeds))
            cut = draw(st.integers(0, len(other)))
            data[pos:] = other[cut:]
        else:
            data += draw(st.binary(min_size=1, max_size=16))
    return bytes(data)
