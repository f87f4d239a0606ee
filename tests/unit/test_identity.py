"""The node identity: one Ed25519 key that is both the libp2p peer id and the signing key."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from swarmnode.identity import (
    KEY_FILE_BYTES,
    Identity,
    load_or_create,
    peer_id_from_public_key,
    public_key_from_peer_id,
    verify_signature,
)

# RFC 8032, section 7.1, TEST 1
RFC_SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC_PUBLIC = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
RFC_SIGNATURE_EMPTY = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
)
# what the libp2p daemon (p2pd) reports for that key; checked against a live daemon in test_hivemind_*
RFC_PEER_ID = "12D3KooWQK1wnefoLrcVHbbnf5tLzbopUd3K3bFAoJpA7YJgL5pV"


def test_rfc8032_key_and_signature():
    identity = Identity.from_seed(RFC_SEED)
    assert identity.public_key == RFC_PUBLIC
    assert identity.sign(b"") == RFC_SIGNATURE_EMPTY
    assert identity.peer_id == peer_id_from_public_key(RFC_PUBLIC) == RFC_PEER_ID


def test_generate_sign_verify():
    a, b = Identity.generate(), Identity.generate()
    assert a.peer_id.startswith("12D3KooW") and len(a.public_key) == 32
    assert a.peer_id != b.peer_id
    sig = a.sign(b"hello")
    assert len(sig) == 64 and sig == a.sign(b"hello")  # deterministic
    assert verify_signature(a.public_key, sig, b"hello")
    assert not verify_signature(a.public_key, sig, b"hellO")
    assert not verify_signature(b.public_key, sig, b"hello")
    assert public_key_from_peer_id(a.peer_id) == a.public_key
    assert public_key_from_peer_id("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N") is None  # an RSA peer id
    assert "private" not in repr(a).lower() and a.peer_id in repr(a)


@pytest.mark.parametrize(
    "key, sig, data",
    [
        (None, b"x" * 64, b""),
        (b"x" * 31, b"x" * 64, b""),
        (b"x" * 32, b"x" * 63, b""),
        ("a" * 32, b"x" * 64, b""),
        (b"\xff" * 32, b"\xff" * 64, b"data"),
        (b"x" * 32, None, b""),
        (b"x" * 32, b"x" * 64, None),
    ],
)
def test_verify_signature_never_raises(key, sig, data):
    assert verify_signature(key, sig, data) is False


def test_small_order_keys_are_refused():
    """The neutral point with S = 0 verifies any message under plain cofactorless verification."""
    neutral = bytes([1]) + bytes(31)
    forged = bytes([1]) + bytes(63)
    assert not verify_signature(neutral, forged, b"any message")
    p = 2**255 - 19
    for y in (0, 1, p - 1, p, p + 1):  # including non-canonical encodings and the sign bit
        for sign in (0, 1 << 255):
            assert not verify_signature(((y | sign) % 2**256).to_bytes(32, "little"), forged, b"m")


def test_save_load_roundtrip_and_file_format(tmp_path):
    identity = Identity.from_seed(RFC_SEED)
    path = tmp_path / "node.key"
    identity.save(path)
    data = path.read_bytes()
    assert len(data) == KEY_FILE_BYTES == 68
    assert data == bytes([0x08, 0x01, 0x12, 0x40]) + RFC_SEED + RFC_PUBLIC
    loaded = Identity.load(path)
    assert loaded == identity and loaded.peer_id == RFC_PEER_ID
    assert loaded.sign(b"x") == identity.sign(b"x")


def test_key_file_mode_is_0600_even_with_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        Identity.generate().save(tmp_path / "a.key")
        Identity.generate().save(tmp_path / "a.key", force=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a.key").st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["a.key"]  # no temporary file left behind


def test_refuses_to_overwrite_without_force(tmp_path):
    path = tmp_path / "node.key"
    first, second = Identity.generate(), Identity.generate()
    first.save(path)
    with pytest.raises(FileExistsError, match="--force"):
        second.save(path)
    assert Identity.load(path) == first
    second.save(path, force=True)
    assert Identity.load(path) == second
    assert [p.name for p in tmp_path.iterdir()] == ["node.key"]


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "not a libp2p Ed25519 private key"),
        (b"\x08\x01\x12\x40" + bytes(10), "not a libp2p Ed25519 private key"),
        (b"\x08\x01\x12\x40" + bytes(65), "not a libp2p Ed25519 private key"),
        (b"\x08\x00\x12\x82\x09" + bytes(100), "RSA"),  # what hivemind's generate_identity writes
        (b"\x08\x02\x12\x20" + bytes(32), "Secp256k1"),
        (b"garbage" * 20, "not a libp2p Ed25519 private key"),
    ],
)
def test_load_rejects_corrupt_or_foreign_files(tmp_path, data, match):
    path = tmp_path / "bad.key"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=match) as info:
        Identity.load(path)
    assert "keygen --force" in str(info.value)


def test_load_rejects_mismatched_public_half(tmp_path):
    data = bytearray(Identity.generate().to_bytes())
    data[-1] ^= 1
    path = tmp_path / "bad.key"
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match"):
        Identity.load(path)


def test_load_or_create(tmp_path):
    path = tmp_path / "sub" / "dir" / "node.key"
    created_identity, created = load_or_create(path)
    assert created and path.exists()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded_identity, created_again = load_or_create(path)
    assert not created_again and loaded_identity == created_identity


def test_hivemind_daemon_uses_the_key_file(tmp_path):
    """p2pd reads the file and derives the same peer id (also pins RFC_PEER_ID to the daemon's answer)."""
    from hivemind.p2p import P2P

    random_identity = Identity.generate()
    random_identity.save(tmp_path / "random.key")
    Identity.from_seed(RFC_SEED).save(tmp_path / "rfc.key")

    async def peer_id_of(path) -> str:
        p2p = await P2P.create(identity_path=str(path), host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        try:
            return p2p.peer_id.to_base58()
        finally:
            await p2p.shutdown()

    async def both() -> tuple[str, str]:
        return await peer_id_of(tmp_path / "random.key"), await peer_id_of(tmp_path / "rfc.key")

    random_peer_id, rfc_peer_id = asyncio.run(both())
    assert random_peer_id == random_identity.peer_id
    assert rfc_peer_id == RFC_PEER_ID


# --- the identity's proof of work, kept beside the key (swarmnode.identity_work) ------------------


def _saved_key(tmp_path, seed: int = 7):
    path = tmp_path / "node.key"
    Identity.from_seed(bytes([seed]) * 32).save(path)
    return path


def test_an_existing_key_file_gets_its_proof_at_first_load_and_keeps_its_peer_id(tmp_path):
    from swarmnode.identity_work import load_or_mint_work, work_path
    from swarmnode.swarm.wire import work

    path = _saved_key(tmp_path)
    key_bytes, peer_id = path.read_bytes(), Identity.load(path).peer_id
    lines: list[str] = []
    nonce = load_or_mint_work(Identity.load(path), path, 12, log=lines.append)
    assert work.has_work(Identity.load(path).public_key, nonce, 12)
    assert lines[0].startswith("minting the identity's proof of work (12 bits, ")
    proof = work_path(path)
    assert proof.name == "node.key.work" and stat.S_IMODE(os.stat(proof).st_mode) == 0o600
    assert json.loads(proof.read_text()) == {"bits": 12, "nonce": nonce.hex()}
    assert path.read_bytes() == key_bytes and Identity.load(path).peer_id == peer_id

    again: list[str] = []
    assert load_or_mint_work(Identity.load(path), path, 12, log=again.append) == nonce
    assert again == []  # kept: minted once per key


def test_a_stored_proof_for_a_lower_d_is_minted_again_and_serves_every_lower_d(tmp_path):
    from swarmnode.identity_work import load_or_mint_work, work_path
    from swarmnode.swarm.wire import work

    path = _saved_key(tmp_path)
    identity = Identity.load(path)
    low = load_or_mint_work(identity, path, 4, log=lambda line: None)
    assert not work.has_work(identity.public_key, low, 14)  # else this test would prove nothing
    lines: list[str] = []
    high = load_or_mint_work(identity, path, 14, log=lines.append)
    assert work.has_work(identity.public_key, high, 14) and high != low
    assert "is for 4 bits, and this swarm asks for 14; minting it again" in lines[0]
    assert json.loads(work_path(path).read_text())["bits"] == 14
    quiet: list[str] = []
    assert load_or_mint_work(identity, path, 8, log=quiet.append) == high and quiet == []


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"bits": 12}',
        b'{"bits": 12, "nonce": "zz"}',
        b'{"bits": 12, "nonce": "0000"}',
        b'{"bits": "12", "nonce": "0000000000000000"}',
        b"\xff\xfe",
        b"{" + b" " * 5000 + b"}",
    ],
)
def test_a_corrupt_proof_file_is_minted_again_with_a_clear_line(tmp_path, content):
    from swarmnode.identity_work import load_or_mint_work, work_path
    from swarmnode.swarm.wire import work

    path = _saved_key(tmp_path)
    work_path(path).write_bytes(content)
    lines: list[str] = []
    nonce = load_or_mint_work(Identity.load(path), path, 10, log=lines.append)
    assert work.has_work(Identity.load(path).public_key, nonce, 10)
    assert lines[0].startswith(f"{work_path(path)}: the proof of work file is corrupt (")
    assert lines[0].endswith("; minting it again")
    assert json.loads(work_path(path).read_text()) == {"bits": 10, "nonce": nonce.hex()}


def test_a_proof_of_another_key_is_minted_again(tmp_path):
    from swarmnode.identity_work import load_or_mint_work

    path = _saved_key(tmp_path, seed=7)
    load_or_mint_work(Identity.load(path), path, 12, log=lambda line: None)
    Identity.from_seed(bytes([8]) * 32).save(path, force=True)  # the key replaced, its old proof left
    lines: list[str] = []
    load_or_mint_work(Identity.load(path), path, 12, log=lines.append)
    assert f"the proof of work is not one for this key ({Identity.load(path).peer_id})" in lines[0]


def test_no_proof_asked_none_made(tmp_path):
    from swarmnode.identity_work import load_or_mint_work, work_path

    path = _saved_key(tmp_path)
    assert load_or_mint_work(Identity.load(path), path, 0, log=pytest.fail) == b""
    assert not work_path(path).exists()


def test_a_proof_that_cannot_be_saved_is_used_and_said(tmp_path):
    from swarmnode.identity_work import load_or_mint_work, work_path
    from swarmnode.swarm.wire import work

    path = _saved_key(tmp_path)
    work_path(path).mkdir()  # neither readable nor replaceable as a file
    lines: list[str] = []
    nonce = load_or_mint_work(Identity.load(path), path, 8, log=lines.append)
    assert work.has_work(Identity.load(path).public_key, nonce, 8)
    assert "the proof of work cannot be read" in lines[0]
    assert lines[-1].startswith(f"could not save the proof of work to {work_path(path)}")
    assert lines[-1].endswith("the next start mints again")


def test_keygen_prints_the_peer_id_and_writes_the_proof(tmp_path):
    from swarmnode.identity_work import work_path
    from swarmnode.swarm.wire import work

    key = tmp_path / "node.key"
    proc = subprocess.run(
        [sys.executable, "-m", "swarmnode.cli", "keygen", "--out", str(key), "--work-bits", "10"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    identity = Identity.load(key)
    assert proc.stdout == identity.peer_id + "\n"
    assert "minting the identity's proof of work (10 bits" in proc.stderr
    stored = json.loads(work_path(key).read_text())
    assert stored["bits"] == 10 and work.has_work(identity.public_key, bytes.fromhex(stored["nonce"]), 10)
    assert stat.S_IMODE(os.stat(work_path(key)).st_mode) == 0o600

    tiny = subprocess.run(
        [sys.executable, "-m", "swarmnode.cli", "keygen", "--out", str(tmp_path / "t.key"),
         "--config", "node_configs/tiny.yaml"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert tiny.returncode == 0, tiny.stderr
    assert json.loads(work_path(tmp_path / "t.key").read_text())["bits"] == 8  # the config's d
