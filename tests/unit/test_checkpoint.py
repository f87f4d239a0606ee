"""Checkpoints on a real tiny model with AdamW state: round trip, validation, pruning, debris."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

from swarmnode import checkpoint
from swarmnode.policy import state_digest
from tests.helpers.checkpoints import save, trained


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2 ties embeddings and lm_head
def test_round_trip_restores_weights_optimizer_and_rng(tmp_path: Path, family: str) -> None:
    model, optimizer = trained(family)
    digest = state_digest(model, optimizer)
    path = checkpoint.save(tmp_path, 3, 7, model, optimizer, digest, keep=3)
    expected_torch, expected_python = torch.rand(4), random.random()  # drawn right after the save

    info = checkpoint.validate(path)
    assert (info.path, info.round, info.policy_version, info.digest) == (path, 3, 7, digest)
    assert checkpoint.newest_valid(tmp_path) == info
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json",
        "model.safetensors",
        "state.json",
        "trainer.pt",
    ]

    other, other_opt = trained(family, seed=1, steps=2)  # other weights, other moments, other step count
    assert state_digest(other, other_opt) != digest
    torch.manual_seed(123)
    random.seed(123)
    checkpoint.restore(info, other, other_opt)
    assert state_digest(other, other_opt) == digest
    assert other_opt.state_dict()["state"][0]["step"].item() == 1
    assert torch.equal(torch.rand(4), expected_torch) and random.random() == expected_python

    # a fresh optimizer that never stepped takes the saved state too (what a restarted node has)
    fresh, _ = trained(family, seed=2, steps=0)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    checkpoint.restore(info, fresh, fresh_opt)
    assert state_digest(fresh, fresh_opt) == digest


def test_state_digest_covers_the_optimizer_state(tmp_path: Path) -> None:
    model, optimizer = trained()
    digest = state_digest(model, optimizer)
    optimizer.state_dict()  # reading it changes nothing
    assert state_digest(model, optimizer) == digest
    next(iter(optimizer.state.values()))["exp_avg_sq"].mul_(2)  # same weights, other second moments
    assert state_digest(model, optimizer) != digest and state_digest(model) == state_digest(model)


def test_pruning_keeps_the_newest(tmp_path: Path) -> None:
    model, optimizer = trained()
    for round_ in range(1, 6):
        save(tmp_path, round_, model, optimizer, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round-000004", "round-000005"]
    save(tmp_path, 12, model, optimizer, keep=2)  # numeric, not lexical, order
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round-000005", "round-000012"]


def test_saving_a_round_again_replaces_it(tmp_path: Path) -> None:
    """After a resume the lost rounds run again and overwrite what a killed run left under their name."""
    model, optimizer = trained()
    save(tmp_path, 2, model, optimizer)
    before = checkpoint.validate(tmp_path / "round-000002").digest
    trained_more, more_opt = trained(steps=2)
    save(tmp_path, 2, trained_more, more_opt)
    after = checkpoint.validate(tmp_path / "round-000002")
    assert after.digest == state_digest(trained_more, more_opt) != before


def test_stray_temp_folders_are_ignored_and_cleared(tmp_path: Path) -> None:
    model, optimizer = trained()
    good = save(tmp_path, 5, model, optimizer)
    stray = tmp_path / ".tmp-round-000009-4242"  # a save killed before its rename
    shutil.copytree(good, stray)
    (tmp_path / "round-notes").mkdir()  # not a checkpoint name

    seen: list[str] = []
    assert checkpoint.newest_valid(tmp_path, log=seen.append).path == good
    assert seen == []
    save(tmp_path, 6, model, optimizer)
    assert not stray.exists()


def test_a_checkpoint_without_manifest_is_skipped(tmp_path: Path) -> None:
    model, optimizer = trained()
    good = save(tmp_path, 5, model, optimizer)
    partial = tmp_path / "round-000008"
    shutil.copytree(good, partial)
    (partial / "manifest.json").unlink()

    seen: list[str] = []
    info = checkpoint.newest_valid(tmp_path, log=seen.append)
    assert info is not None and info.path == good
    assert len(seen) == 1 and seen[0].startswith(
        f"skipping checkpoint {partial}: missing or unreadable manifest"
    )


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: os.truncate(p / "trainer.pt", 100), "trainer.pt does not match its checksum"),
        (lambda p: (p / "model.safetensors").unlink(), "model.safetensors missing"),
        (lambda p: (p / "state.json").write_text("{}"), "state.json does not match its checksum"),
        (lambda p: (p / "manifest.json").write_text('{"round": 7'), "missing or unreadable manifest"),
        (lambda p: (p / "manifest.json").write_bytes(b"\xff\xfe"), "missing or unreadable manifest"),
        # valid JSON of the wrong shape (found by tests/fuzz/test_fuzz_checkpoint.py: these crashed resume)
        (lambda p: (p / "manifest.json").write_text("null"), "manifest has no map of file checksums"),
        (lambda p: edit_manifest(p, files=[]), "manifest has no map of file checksums"),
        (lambda p: edit_manifest(p, round="7"), "manifest round, policy_version or digest"),
        (lambda p: edit_manifest(p, digest=None), "manifest round, policy_version or digest"),
    ],
    ids=[
        *("truncated", "missing file", "edited", "cut manifest", "not utf-8"),
        *("null", "files list", "round string", "no digest"),
    ],
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, damage, message) -> None:
    model, optimizer = trained()
    previous = save(tmp_path, 6, model, optimizer)
    newest = save(tmp_path, 7, model, optimizer)
    damage(newest)

    with pytest.raises(ValueError, match=message):
        checkpoint.validate(newest)
    seen: list[str] = []
    assert checkpoint.newest_valid(tmp_path, log=seen.append).path == previous
    assert seen == [f"skipping checkpoint {newest}: {checkpoint_error(newest)}"]


def edit_manifest(path: Path, **changes) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, **changes}))


def test_a_checkpoint_whose_manifest_names_another_round_is_skipped(tmp_path: Path) -> None:
    """Resuming from it would skip rounds (or repeat them): the folder name and the manifest must agree."""
    model, optimizer = trained()
    previous = save(tmp_path, 6, model, optimizer)
    newest = save(tmp_path, 7, model, optimizer)
    edit_manifest(newest, round=9)
    seen: list[str] = []
    assert checkpoint.newest_valid(tmp_path, log=seen.append).path == previous
    assert seen == [f"skipping checkpoint {newest}: its manifest says round 9 (corrupt, or renamed)"]


def checkpoint_error(path: Path) -> str:
    try:
        checkpoint.validate(path)
    except ValueError as exc:
        return str(exc)
    raise AssertionError(f"{path} is valid")


def test_no_checkpoint_at_all(tmp_path: Path) -> None:
    assert checkpoint.newest_valid(tmp_path / "missing") is None
    assert checkpoint.newest_valid(tmp_path) is None


def test_the_manifest_records_round_version_digest_and_checksums(tmp_path: Path) -> None:
    model, optimizer = trained()
    path = save(tmp_path, 4, model, optimizer)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["round"] == 4 and manifest["policy_version"] == 8
    assert manifest["digest"] == state_digest(model, optimizer)
    assert set(manifest["files"]) == {"model.safetensors", "trainer.pt", "state.json"}
    # trainer.pt holds tensors and plain containers only: loadable without unpickling arbitrary objects
    assert set(torch.load(path / "trainer.pt", weights_only=True)) == {"optimizer", "torch_rng"}


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2's tied embeddings are stored once
def test_the_size_estimate_made_before_training_matches_a_saved_checkpoint(tmp_path: Path, family) -> None:
    model, optimizer = trained(family)
    estimate = checkpoint.estimated_size(model)
    path = save(tmp_path, 1, model, optimizer)
    written = sum(f.stat().st_size for f in path.iterdir())
    # headers, step counters, RNG state and the manifest are the difference: a few KB on top of the tensors
    assert estimate <= written <= estimate * 1.05 + 64 * 1024, (estimate, written)
