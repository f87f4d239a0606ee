"""Fuzzing checkpoint discovery: whatever a damaged newest checkpoint holds, a restarting node picks the
newest *valid* one, says which one it skipped and why, and never crashes on the way.

Damage: the manifest replaced by any JSON value or by random bytes, one of its fields changed, a
checkpoint file's bytes flipped, cut short or replaced. Seeds: two real checkpoints of a tiny model with
AdamW state (rounds 1 and 2); round 2 is damaged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode import checkpoint
from tests.helpers.checkpoints import save, trained
from tests.helpers.mutations import fuzz_settings, note

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("seeds")
    model, optimizer = trained()
    save(root, 1, model, optimizer)
    save(root, 2, model, optimizer)
    return root


@st.composite
def damage(draw) -> tuple[str, object]:
    """(what, how): a description of one kind of damage, applied by ``apply``."""
    kind = draw(st.sampled_from(["manifest_json", "manifest_bytes", "manifest_field", "file"]))
    if kind == "manifest_json":
        return kind, draw(json_values)
    if kind == "manifest_bytes":
        return kind, draw(st.binary(max_size=200))
    if kind == "manifest_field":
        field = draw(st.sampled_from(["round", "policy_version", "digest", "files", "model.safetensors"]))
        return kind, (field, draw(json_values))
    name = draw(st.sampled_from(checkpoint.FILES))
    return kind, (name, draw(st.sampled_from(["flip", "truncate", "replace"])), draw(st.integers(0, 10**6)))


def apply(path: Path, kind: str, how) -> None:
    manifest_path = path / "manifest.json"
    if kind == "manifest_json":
        manifest_path.write_text(json.dumps(how))
    elif kind == "manifest_bytes":
        manifest_path.write_bytes(how)
    elif kind == "manifest_field":
        field, value = how
        manifest = json.loads(manifest_path.read_text())
        if field in checkpoint.FILES:
            manifest["files"][field] = value
        else:
            manifest[field] = value
        manifest_path.write_text(json.dumps(manifest))
    else:
        name, action, position = how
        target = path / name
        data = bytearray(target.read_bytes())
        position %= len(data)
        if action == "flip":
            data[position] ^= 0x40
        elif action == "truncate":
            del data[position:]
        else:
            data = bytearray(b"not a checkpoint file")
        target.write_bytes(bytes(data))


@fuzz_settings(scale=0.3)
@given(damage())
def test_a_damaged_newest_checkpoint_is_skipped_with_a_message(seeds, tmp_path_factory, damaged):
    root = tmp_path_factory.mktemp("ckpt")
    shutil.copytree(seeds, root, dirs_exist_ok=True)
    newest = root / "round-000002"
    apply(newest, *damaged)

    messages: list[str] = []
    info = checkpoint.newest_valid(root, log=messages.append)

    assert info is not None
    if info.round == 2:  # the damage left a consistent checkpoint (e.g. an equal value written back)
        note("still valid")
        assert messages == [] and info.path == newest
        return
    note(f"skipped: {damaged[0]}")
    assert info.round == 1 and info.path == root / "round-000001"
    assert len(messages) == 1 and messages[0].startswith(f"skipping checkpoint {newest}: "), messages
