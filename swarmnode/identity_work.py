"""The identity's proof of work on disk: ``<key file>.work`` beside the key, minted once per key and d.

The proof (``swarm.wire.work``) is a function of the key and the swarm's ``swarm.identity_work_bits``, so
it is kept rather than minted at every start: a small JSON file ``{"bits": d, "nonce": "<16 hex>"}``
written like the key (a 0600 temporary file, flushed, renamed into place). ``load_or_mint_work`` keeps a
stored nonce that proves at least the asked d for this key (a proof for a higher d serves every lower
one), and otherwise mints one with a progress line and saves it; so a key file made before the proof
existed gets one at its first start, and its peer id does not change. A file that cannot be read or does
not prove enough is minted again, said in one line; a file that cannot be written costs the next start
another mint, never this one.

Above the base layer (it uses ``swarm.wire.work``); ``swarmnode keygen`` and the swarm start-up
(``join.py``) call it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from swarmnode import common
from swarmnode.identity import Identity
from swarmnode.swarm.wire import work

WORK_FILE_SUFFIX = ".work"
MAX_WORK_FILE_BYTES = 4096  # a proof file is ~40 bytes: a larger one is not ours, and is never read whole


def work_path(key_path: str | os.PathLike) -> Path:
    """Where the proof of the key at ``key_path`` is kept: the key file's name + ``.work``."""
    key_path = Path(key_path)
    return key_path.with_name(key_path.name + WORK_FILE_SUFFIX)


def load_or_mint_work(
    identity: Identity, key_path: str | os.PathLike, bits: int, *, log: Callable[[str], None] = common.log
) -> bytes:
    """This identity's proof of at least ``bits`` of work: the stored one if it holds, else a new one,
    minted (lines through ``log``, at most one a second) and saved beside the key. ``bits`` 0: b"" (no
    proof asked, none carried; nothing is read or written)."""
    if bits == 0:
        return b""
    path = work_path(key_path)
    stored, problem = read_work(path, identity, bits)
    if stored is not None:
        return stored
    if problem:
        log(f"{path}: {problem}; minting it again")
    nonce = mint_with_progress(identity, bits, log)
    try:
        save_work(path, bits, nonce)
    except OSError as exc:
        log(f"could not save the proof of work to {path} ({exc.strerror or exc}): the next start mints again")
    return nonce


def read_work(path: Path, identity: Identity, bits: int) -> tuple[bytes | None, str]:
    """(nonce, "") when ``path`` holds a proof of ``bits`` for ``identity``; else (None, what is wrong),
    "" when there is no file."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_WORK_FILE_BYTES + 1)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"the proof of work cannot be read ({exc.strerror or exc})"
    try:
        if len(data) > MAX_WORK_FILE_BYTES:
            raise ValueError(f"over {MAX_WORK_FILE_BYTES} bytes")
        record = json.loads(data)
        stored_bits, nonce = record["bits"], bytes.fromhex(record["nonce"])
        if type(stored_bits) is not int or len(nonce) != work.NONCE_BYTES:
            raise ValueError(f"expected an integer bits and a {2 * work.NONCE_BYTES}-hex-digit nonce")
    except (ValueError, TypeError, KeyError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        return None, f"the proof of work file is corrupt ({exc.__class__.__name__}: {exc})"
    if work.has_work(identity.public_key, nonce, bits):
        return nonce, ""
    if work.has_work(identity.public_key, nonce, min(stored_bits, bits)):
        return None, f"the proof of work is for {stored_bits} bits, and this swarm asks for {bits}"
    return None, f"the proof of work is not one for this key ({identity.peer_id})"


def save_work(path: Path, bits: int, nonce: bytes) -> None:
    """Write the proof file atomically, mode 0600 from its creation on (as the key file is written)."""
    data = json.dumps({"bits": bits, "nonce": nonce.hex()}).encode() + b"\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mode 0600
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    common.fsync_dir(path.parent)


def mint_with_progress(identity: Identity, bits: int, log: Callable[[str], None] = common.log) -> bytes:
    """``work.mint`` with a line before (d and the expected time, from this machine's hash rate), one a
    second while it runs (the share of the expected tries done, and the rate) and one at the end."""
    expected = 2**bits
    log(
        f"minting the identity's proof of work ({bits} bits, "
        f"{duration(expected / work.measure_rate())} on one core)"
    )

    def progress(tries: int, rate: float) -> None:
        log(f"  ... {100 * tries / expected:.0f}% of the expected {expected:,} tries ({rate / 1e6:.1f} M/s)")

    start = time.monotonic()
    nonce = work.mint(identity.public_key, bits, progress=progress)
    tries = int.from_bytes(nonce, "big") + 1
    log(f"proof of work minted: {tries:,} tries in {time.monotonic() - start:.1f} s")
    return nonce


def duration(seconds: float) -> str:
    """A rough duration for a person: "under a second", "about 12 s", "about 3 min", "about 2.5 h"."""
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"
