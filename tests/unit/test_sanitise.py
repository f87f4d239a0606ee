"""Peer strings never reach the terminal raw (issue #26): a status.json whose peer's model name, peer id and
ban reason hold C1 controls, bidi overrides and zero-width characters, printed by ``swarmnode status``
(the real CLI in a subprocess), shows them escaped and capped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

RAW_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
HOSTILE_MODEL = "tiny\x9b2J\x1b]0;owned\x07\u202egnp.exe\u2066\u200b\ufeff\u2028" + "\u202e" * 5_000
HOSTILE_PEER = "12D3KooW\u202epeer\x85"


def _status_folder(tmp_path: Path) -> Path:
    swarm = {
        "peer_id": "12D3KooWexample", "swarm_id": "s", "addrs": ["/ip4/127.0.0.1/tcp/1"], "connected": 1,
        "peers": {HOSTILE_PEER: {"model": HOSTILE_MODEL, "policy_version": "\x9b3", "round": 3,
                                 "seen_s_ago": 2.0, "banned": True}},
        "rollouts": {"groups_published": 4, "batches_published": 1, "batches_received": 1,
                     "groups_accepted": 2, "groups_trained": 2},
        "arrival_s": {"count": 0, "sum": 0.0}, "rejected": {"bad\u2067reason": 1},
        "bans": [{"peer": HOSTILE_PEER, "remaining_s": 30.0, "reason": "bad\x9b\u202e", "count": 1}],
        "updated": time.time(),
    }  # fmt: skip
    (tmp_path / "status.json").write_text(json.dumps(swarm))
    return tmp_path


def test_swarmnode_status_prints_no_raw_control_bidi_or_format_character(tmp_path):
    folder = _status_folder(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "swarmnode.cli", "status", "--run-dir", str(folder)],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode("utf-8")
    raw = sorted({f"U+{ord(c):04X}" for c in out if c != "\n" and unicodedata.category(c) in RAW_CATEGORIES})
    assert not raw, raw
    peer_line = next(line for line in out.splitlines() if "policy v" in line)
    assert "\\x9b2J" in peer_line and "\\u202egnp.exe" in peer_line and "\\u2066" in peer_line, peer_line
    assert len(peer_line) < 400, len(peer_line)  # the 5 000 overrides are cut, not printed
    assert "\\x85" in out and "bad\\x9b\\u202e" in out and "bad\\u2067reason" in out, out
