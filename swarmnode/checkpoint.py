"""Atomic, self-verifying checkpoints: weights, optimizer, RNG states and the round counter.

Layout: ``<run_dir>/checkpoints/round-000012/`` holding ``model.safetensors``, ``trainer.pt``
(optimizer + torch RNG, loaded with ``weights_only=True``: tensors and plain containers only, never
arbitrary pickled objects), ``state.json`` and, written last, ``manifest.json`` with the sha256 of
every file. A checkpoint is built in a temporary sibling folder and renamed into place, so a crash
mid-write leaves either the previous checkpoint or a stray temp folder, never a half checkpoint under
a valid name; a checkpoint whose files do not match its manifest (disk corruption, truncation) is
reported and skipped, and the next newest valid one is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from swarmnode.common import fsync_dir, log
from swarmnode.errors import ConfigError

PREFIX = "round-"
FILES = ("model.safetensors", "trainer.pt", "state.json")


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    round: int
    policy_version: int
    digest: str  # state_digest(model, optimizer) at save time


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def estimated_size(model, optimizer_moments: int = 2) -> int:
    """Bytes one checkpoint of ``model`` takes: its weights plus the optimizer's per-parameter moments
    (AdamW keeps two, in the parameters' dtype). Known before the first step creates those moments, so a
    node can tell at start whether its disk will hold the checkpoints it is set to keep."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return weights * (1 + optimizer_moments)


def save(root: Path, round_: int, policy_version: int, model, optimizer, digest: str, keep: int) -> Path:
    """Write checkpoint ``round_`` atomically under ``root`` and prune to the newest ``keep``.

    Raises OSError when it cannot be written (disk full, I/O error); the checkpoints already there are
    left as they were, and nothing of the new one remains."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{round_:06d}"
    tmp = root / f".tmp-{PREFIX}{round_:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, round_, policy_version, model, optimizer, digest)
    except BaseException as exc:  # a half-written folder would only take the space others need
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception) and not isinstance(exc, OSError):
            # safetensors and torch report a full disk or an I/O error as their own exception types
            raise OSError(f"writing checkpoint round {round_} failed: {exc}") from exc
        raise
    if final.exists():  # a re-run of the same round after a resume: replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(root)
    _prune(root, keep)
    return final


def _write(tmp: Path, round_: int, policy_version: int, model, optimizer, digest: str) -> None:
    """Every file of a checkpoint into the new folder ``tmp``, flushed to disk, the manifest last."""
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state()}, tmp / "trainer.pt")
    state = {"round": round_, "policy_version": policy_version, "python_rng": _python_rng_to_json()}
    (tmp / "state.json").write_text(json.dumps(state))
    manifest = {"round": round_, "policy_version": policy_version, "digest": digest}
    manifest["files"] = {name: _sha256(tmp / name) for name in FILES}
    for name in FILES:
        with (tmp / name).open("rb+") as f:
            os.fsync(f.fileno())
    with (tmp / "manifest.json").open("w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())


def _prune(root: Path, keep: int) -> None:
    for stale in candidates(root)[keep:]:
        shutil.rmtree(stale, ignore_errors=True)
    for tmp in root.glob(f".tmp-{PREFIX}*"):
        shutil.rmtree(tmp, ignore_errors=True)


def candidates(root: Path) -> list[Path]:
    """Checkpoint folders, newest first."""
    found = []
    for path in root.glob(f"{PREFIX}*"):
        try:
            found.append((int(path.name[len(PREFIX) :]), path))
        except ValueError:
            continue
    return [p for _, p in sorted(found, reverse=True)]


def validate(path: Path) -> CheckpointInfo:
    """Check a checkpoint folder against its manifest; raises ValueError saying what is wrong."""
    try:
        manifest = json.loads((path / "manifest.json").read_bytes())
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not JSON
        raise ValueError(f"missing or unreadable manifest ({exc})") from None
    # The manifest is checked for shape too: damage can leave valid JSON of another shape behind.
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise ValueError("manifest has no map of file checksums (corrupt)")
    round_, version, digest = (manifest.get(key) for key in ("round", "policy_version", "digest"))
    if not (type(round_) is int and type(version) is int and isinstance(digest, str)):
        raise ValueError("manifest round, policy_version or digest missing or of the wrong type (corrupt)")
    for name in FILES:
        expected = files.get(name)
        if expected is None or not (path / name).is_file():
            raise ValueError(f"{name} missing")
        if _sha256(path / name) != expected:
            raise ValueError(f"{name} does not match its checksum (corrupt or truncated)")
    return CheckpointInfo(path, round_, version, digest)


def newest_valid(root: Path, log=log) -> CheckpointInfo | None:
    """The newest checkpoint that passes validation; invalid newer ones are reported and skipped."""
    for path in candidates(root) if root.is_dir() else []:
        try:
            info = validate(path)
            if path.name != f"{PREFIX}{info.round:06d}":  # resuming from it would skip or repeat rounds
                raise ValueError(f"its manifest says round {info.round} (corrupt, or renamed)")
            return info
        except ValueError as exc:
            log(f"skipping checkpoint {path}: {exc}")
    return None


def choose(run_dir: Path, *, path: Path | None = None, round_: int | None = None) -> CheckpointInfo | None:
    """The checkpoint a command asked for: a folder (``--checkpoint``), a round of the run (``--round``),
    or else the newest valid one (None when the run has none). Raises ConfigError when the asked-for
    one is missing or fails validation."""
    if round_ is not None:
        path = Path(run_dir) / "checkpoints" / f"{PREFIX}{round_:06d}"
        if not path.is_dir():
            kept = sorted(p.name for p in candidates(Path(run_dir) / "checkpoints")) or "none"
            raise ConfigError(f"--round {round_}: no checkpoint of that round in {run_dir} (kept: {kept})")
    if path is None:
        return newest_valid(Path(run_dir) / "checkpoints")
    try:
        return validate(path)
    except ValueError as exc:
        raise ConfigError(f"checkpoint {path}: {exc}") from None


def load_model_weights(info: CheckpointInfo, model) -> None:
    load_model(model, str(info.path / "model.safetensors"), strict=True)


def restore(info: CheckpointInfo, model, optimizer) -> None:
    """Load weights, optimizer state and RNG states from a validated checkpoint."""
    load_model_weights(info, model)
    trainer_state = torch.load(info.path / "trainer.pt", weights_only=True, map_location="cpu")
    optimizer.load_state_dict(trainer_state["optimizer"])
    torch.set_rng_state(trainer_state["torch_rng"])
    state = json.loads((info.path / "state.json").read_text())
    _python_rng_from_json(state["python_rng"])


def _python_rng_to_json() -> list:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _python_rng_from_json(state: list) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


def rng_state() -> tuple:
    """The random states a checkpoint saves (torch's CPU generator, Python's ``random``), to put back
    with ``set_rng_state`` when a round is abandoned before it changed anything else."""
    return torch.get_rng_state(), random.getstate()


def set_rng_state(state: tuple) -> None:
    torch_state, python_state = state
    torch.set_rng_state(torch_state)
    random.setstate(python_state)
