"""common.atomic_write: a file planted where its temporary file goes (a symlink to a file outside the
folder) is never written through, whatever temporary name the write picks."""

from __future__ import annotations

import os
import stat
import tempfile

from swarmnode import common


def _outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "precious"
    target.write_bytes(b"keep me")
    folder = tmp_path / "run"
    folder.mkdir()
    return folder, target


def test_a_symlink_planted_at_the_pid_named_temporary_file_is_not_followed(tmp_path):
    """The old code opened ``.<name>.<pid>.tmp`` with a plain open: it wrote through the link into the file
    outside, then renamed the link over the destination."""
    folder, target = _outside(tmp_path)
    path = folder / "status.json"
    (folder / f".{path.name}.{os.getpid()}.tmp").symlink_to(target)
    common.atomic_write(path, "new contents")
    assert target.read_bytes() == b"keep me"
    assert path.read_text() == "new contents" and not path.is_symlink()


def test_a_symlink_planted_at_whatever_name_the_write_picks_first_is_not_followed(tmp_path, monkeypatch):
    """The temporary name is random; the test makes the first name tried one where a link waits (tempfile's
    candidate names are its private API: this pins that the file is created exclusively, not followed)."""
    folder, target = _outside(tmp_path)
    path = folder / "known_peers.json"
    planted = "planted"
    names = iter([planted, "fresh1", "fresh2"])
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)
    for candidate in (f".{path.name}.{planted}.tmp", f".{path.name}.{planted}", f"{planted}.tmp", planted):
        (folder / candidate).symlink_to(target)
    common.atomic_write(path, b"\x00bytes")
    assert target.read_bytes() == b"keep me"
    assert path.read_bytes() == b"\x00bytes" and not path.is_symlink()
    leftovers = {p.name for p in folder.iterdir()} - {path.name}
    assert all((folder / name).is_symlink() for name in leftovers)  # no temporary file left behind


def test_the_written_file_gets_the_mode_a_plain_open_gives_and_replaces_the_old_one(tmp_path):
    path = tmp_path / "targets.json"
    path.write_text("old")
    old_umask = os.umask(0o022)
    try:
        common.atomic_write(path, "new")
    finally:
        os.umask(old_umask)
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable by a Prometheus of another user, as before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
