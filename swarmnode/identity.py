"""The node's one Ed25519 key: its libp2p identity (peer id ``12D3KooW...``) and its signing key.

The key file is what the libp2p daemon reads (``hivemind.P2P.create(identity_path=...)``): the protobuf
``PrivateKey`` message of the libp2p spec, with KeyType Ed25519 (1) and Data = 32-byte seed || 32-byte
public key. That message is always 68 bytes, so it is written and read by hand:

    08 01            field 1 (Type, varint) = 1 (Ed25519)
    12 40 <64 B>     field 2 (Data, bytes), length 64

The peer id is base58btc of the *identity* multihash (code 0x00, length) of the protobuf ``PublicKey``
(``08 01 12 20`` + 32-byte raw public key); Ed25519 keys are short enough that libp2p inlines them
instead of hashing, which is why every Ed25519 peer id starts with ``12D3KooW``.

Note for callers: hivemind's ``P2P.create`` checks ``identity_path`` against its peers with code that
only understands RSA keys; pass ``check_if_identity_free=False`` together with ``initial_peers``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from pathlib import Path

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from swarmnode.common import fsync_dir

KEY_TYPE_ED25519 = 1
PRIVATE_KEY_HEADER = bytes([0x08, KEY_TYPE_ED25519, 0x12, 0x40])  # then 64 bytes: seed || public key
PUBLIC_KEY_HEADER = bytes([0x08, KEY_TYPE_ED25519, 0x12, 0x20])  # then 32 bytes: public key
KEY_FILE_BYTES = len(PRIVATE_KEY_HEADER) + 64
_KEY_TYPE_NAMES = {0: "RSA", 1: "Ed25519", 2: "Secp256k1", 3: "ECDSA"}

# y-coordinates of the eight points of small order on edwards25519 (as in libsodium's blocklist). A
# public key with one of them "verifies" signatures it never made (e.g. the neutral point with S = 0),
# so it is refused whatever its encoding (sign bit, y >= p).
_P = 2**255 - 19
_Y_ORDER_8 = 0x5FC536D880238B13933C6D305ACDFD5F098EFF289F4C345B027B2C28F95E826
_SMALL_ORDER_Y = frozenset({0, 1, _P - 1, _Y_ORDER_8, _P - _Y_ORDER_8})


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@functools.lru_cache(maxsize=4096)
def peer_id_from_public_key(raw32: bytes) -> str:
    """The libp2p peer id (``12D3KooW...``) of a raw 32-byte Ed25519 public key."""
    if not isinstance(raw32, bytes) or len(raw32) != 32:
        raise ValueError("an Ed25519 public key is 32 raw bytes")
    public_key_pb = PUBLIC_KEY_HEADER + raw32
    return base58.b58encode(bytes([0x00, len(public_key_pb)]) + public_key_pb).decode("ascii")


def public_key_from_peer_id(peer_id: str) -> bytes | None:
    """The raw Ed25519 public key inlined in an Ed25519 peer id, or None for any other peer id."""
    try:
        raw = base58.b58decode(peer_id)
    except (ValueError, TypeError):
        return None
    if len(raw) != 38 or raw[:2] != bytes([0x00, 36]) or raw[2:6] != PUBLIC_KEY_HEADER:
        return None
    return raw[6:]


def is_small_order(raw32: bytes) -> bool:
    y = int.from_bytes(raw32, "little") & ((1 << 255) - 1)
    return y % _P in _SMALL_ORDER_Y


def verify_signature(raw32: bytes, signature: bytes, data: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``data`` by ``raw32``. Never raises."""
    try:
        if not (isinstance(raw32, bytes) and len(raw32) == 32 and isinstance(signature, bytes)):
            return False
        if len(signature) != 64 or is_small_order(raw32):
            return False
        Ed25519PublicKey.from_public_bytes(raw32).verify(signature, bytes(data))
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False
    except Exception:  # noqa: BLE001 - a verifier at the network edge answers, it does not crash
        return False


class Identity:
    """An Ed25519 key pair. ``repr`` never shows the private half."""

    __slots__ = ("_private", "public_key", "peer_id")

    def __init__(self, private_key: Ed25519PrivateKey):
        self._private = private_key
        self.public_key: bytes = _raw_public(private_key.public_key())
        self.peer_id: str = peer_id_from_public_key(self.public_key)

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """Deterministic identity from a 32-byte seed (test vectors, fixtures)."""
        if not isinstance(seed, bytes | bytearray) or len(seed) != 32:
            raise ValueError("an Ed25519 seed is 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(seed)))

    # --- the libp2p key file -------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The libp2p protobuf ``PrivateKey`` (68 bytes) that the key file holds."""
        seed = self._private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return PRIVATE_KEY_HEADER + seed + self.public_key

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "key") -> Identity:
        """Parse the libp2p protobuf ``PrivateKey``; ValueError that says what is wrong otherwise."""
        fix = "generate a new one with `swarmnode keygen --force` (this changes the node's peer id)"
        if len(data) >= 2 and data[0] == 0x08 and data[1] != KEY_TYPE_ED25519:
            kind = _KEY_TYPE_NAMES.get(data[1], f"type {data[1]}")
            raise ValueError(
                f"{source} holds a libp2p {kind} key (hivemind generates RSA identities), but swarmnode "
                f"needs an Ed25519 key to sign its messages; {fix}"
            )
        if len(data) != KEY_FILE_BYTES or data[:4] != PRIVATE_KEY_HEADER:
            raise ValueError(
                f"{source} is not a libp2p Ed25519 private key ({len(data)} bytes; expected "
                f"{KEY_FILE_BYTES} bytes starting with {PRIVATE_KEY_HEADER.hex()}): the file is corrupt "
                f"or of another kind; {fix}"
            )
        identity = cls.from_seed(data[4:36])
        if identity.public_key != data[36:]:
            raise ValueError(f"{source} is corrupt: its public key does not match its private key; {fix}")
        return identity

    @classmethod
    def load(cls, path: str | os.PathLike) -> Identity:
        path = Path(path)
        with open(path, "rb") as f:
            data = f.read(KEY_FILE_BYTES + 1)  # a key file is tiny: never read a huge file whole
        return cls.from_bytes(data, source=f"identity file {str(path)!r}")

    def save(self, path: str | os.PathLike, force: bool = False) -> None:
        """Write the key file with mode 0600 from its creation on; never overwrite unless ``force``.

        The key goes to a temporary 0600 file in the same directory, is flushed to disk, then takes the
        final name atomically (a hard link when not forcing, so a file that appears meanwhile is never
        replaced; ``os.replace`` when forcing).
        """
        path = Path(path)
        if not force and os.path.lexists(path):
            raise _exists_error(path)
        directory = path.parent
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)  # mode 0600
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(self.to_bytes())
                f.flush()
                os.fsync(f.fileno())
            if force:
                os.replace(tmp, path)
            else:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise _exists_error(path) from None
                except OSError:  # a filesystem without hard links
                    if os.path.lexists(path):
                        raise _exists_error(path) from None
                    os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        fsync_dir(directory)

    # --- signing -------------------------------------------------------------------------------
    def sign(self, data: bytes) -> bytes:
        """64-byte Ed25519 signature (deterministic: same key and data give the same bytes)."""
        return self._private.sign(bytes(data))

    def __repr__(self) -> str:
        return f"Identity(peer_id={self.peer_id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and other.public_key == self.public_key

    def __hash__(self) -> int:
        return hash(self.public_key)


def _exists_error(path: Path) -> FileExistsError:
    return FileExistsError(
        f"identity file {str(path)!r} already exists; refusing to overwrite it (that would change this "
        f"node's peer id). Pass --force to replace it."
    )


def load_or_create(path: str | os.PathLike) -> tuple[Identity, bool]:
    """Load the key file, or create it (and its directory) if missing. Returns (identity, created)."""
    path = Path(path)
    if path.exists():
        return Identity.load(path), False
    path.parent.mkdir(parents=True, exist_ok=True)
    identity = Identity.generate()
    try:
        identity.save(path)
    except FileExistsError:  # another process created it meanwhile: use theirs
        return Identity.load(path), False
    return identity, True
