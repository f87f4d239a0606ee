"""Small helpers every layer uses: the console line (and quiet libraries), a bounded memory, and durable
file writes.

Pure standard library (and tqdm): importing this module loads no torch, hivemind or reasoning-gym.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

from tqdm import tqdm

K = TypeVar("K", bound=Hashable)


def log(message: str) -> None:
    """One console line on stderr, printed above the round progress bar when one is drawn."""
    tqdm.write(message, file=sys.stderr)


VERBOSE_ENV = "SWARMNODE_VERBOSE"  # =1: the libraries' warnings and bars, as ``swarmnode -v`` shows them
# Libraries' own progress bars and advice, read by huggingface_hub and transformers when they are imported
QUIET_LIBRARY_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
# Warnings a user can act on: swarmnode's own renamed config keys (config.py), raised as FutureWarning
OWN_WARNINGS = r"swarm\.\w+ is deprecated"


def quiet_libraries() -> None:
    """Keep a normal run's output to swarmnode's own lines: no deprecation warnings from libraries (the
    user cannot fix them, and under systemd they fill the journal) and no Hugging Face loading bars.
    Must run before transformers is imported; an environment variable the user set wins."""
    for key, value in QUIET_LIBRARY_ENV.items():
        os.environ.setdefault(key, value)
    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("default", message=OWN_WARNINGS, category=FutureWarning)


class BoundedSet(Generic[K]):
    """An insertion-ordered set that forgets its oldest keys beyond ``cap``.

    Everything a node remembers about what peers sent (digests seen, records refused, peers ignored)
    lives in one of these, so it stays bounded however long the node runs and whatever peers send.
    A key added again keeps its place, so eviction stays oldest-first.
    """

    def __init__(self, cap: int):
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.cap = cap
        self._keys: dict[K, None] = {}

    def add(self, key: K) -> None:
        self._keys[key] = None
        while len(self._keys) > self.cap:
            del self._keys[next(iter(self._keys))]

    def discard(self, key: K) -> None:
        self._keys.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)


class WriteFailures:
    """Writes outside checkpoints that may fail (a full disk, a folder made read-only) without stopping
    the node: ``guard(path)`` swallows an OSError, counts it and says so once per file name."""

    def __init__(self) -> None:
        self.count = 0
        self._said: set[str] = set()

    @contextlib.contextmanager
    def guard(self, path: Path) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            self.count += 1
            if path.name not in self._said:
                self._said.add(path.name)
                log(f"cannot write {path} ({exc.strerror or exc}); the node keeps running without it: "
                    "free some disk space")  # fmt: skip


def fsync_dir(directory: Path) -> None:
    """Flush a folder's entries to disk, so a rename into it survives a power cut. Best effort: some
    filesystems refuse to open or sync a folder, and the rename has happened either way."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` so a reader (or a crash) sees the old file or the new one, never
    half of one: write a temporary file beside it, flush it to disk, rename it over ``path``.

    The temporary file is created by ``tempfile.mkstemp`` (a random name, ``O_CREAT | O_EXCL | O_NOFOLLOW``):
    a file or symlink already at a name is never opened or written through, so whoever can write to the
    folder cannot redirect the write to a file elsewhere. It gets the mode a plain ``open`` would give
    (0666 less the umask), so other readers (Prometheus reading the targets file) keep reading it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)


DEFAULT_UMASK = 0o022  # where the process's umask cannot be read without changing it


def _umask() -> int:
    """The process's umask, read from /proc (setting it to read it back would race other threads)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    return DEFAULT_UMASK
