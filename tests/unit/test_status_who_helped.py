"""`swarmnode status` shows who helped and how the node is connected (issue #30): on a NATed node it listed
only the relay while the node had trained on 15 groups of another peer; client mode, pulls by source and
each peer's tokenizer were only in status.json, per-peer contributions only in peer_groups.jsonl."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from swarmnode.status import format_status, read_status
from tests.helpers.run_folders import HELPER, RELAY, nated_node, round_record, status_json, write_run_folder


def _lines(folder) -> list[str]:
    return format_status(read_status(folder)).splitlines()


def _line(lines: list[str], *needles: str) -> str:
    found = [line for line in lines if all(n in line for n in needles)]
    assert len(found) == 1, (needles, lines)
    return found[0]


def test_status_lists_the_peer_a_nated_node_trained_from_though_it_is_not_in_the_roster(tmp_path):
    lines = _lines(nated_node(tmp_path))
    helper = _line(lines, HELPER)
    assert "not in the roster" in helper and "trained on 15 of its groups (last in round 8)" in helper, helper
    assert "trained on 2 of its groups (last in round 7)" in _line(lines, RELAY)
    assert "who helped: 17 peer groups trained on, from 2 peer(s)" in lines


def test_status_says_the_node_is_in_client_mode(tmp_path):
    line = _line(_lines(nated_node(tmp_path)), "connection:")
    assert line.startswith("connection: client mode (dial-back: unreachable)"), line
    full = write_run_folder(tmp_path / "full", [round_record(1)], status_json(client_mode=False))
    assert _line(_lines(full), "connection:").startswith("connection: full member")


def test_status_shows_pulls_by_source_and_each_peers_tokenizer_and_standing(tmp_path):
    lines = _lines(nated_node(tmp_path))
    assert "peer batches found by: notice 3, holder 12" in lines
    relay = _line(lines, RELAY)
    assert "tiny-qwen2  tokenizer 77aa00112233" in relay and "(ours)" not in relay and "standing" in relay


def test_a_peers_round_is_shown_with_the_age_of_the_message_it_came_from_as_of_now(tmp_path):
    """status.json is written once a round: a message 4 s old then is 64 s old a minute later (the old
    line said "seen 4s ago" however old the file was)."""
    folder = nated_node(tmp_path)
    status = json.loads((folder / "status.json").read_text())
    (folder / "status.json").write_text(json.dumps({**status, "updated": time.time() - 60}))
    relay = _line(_lines(folder), RELAY)
    assert re.search(r"policy v7  round 8 \(announced 6[45] s ago\)", relay), relay


def test_who_helped_is_counted_over_the_tail_it_read_and_says_from_which_round(tmp_path, monkeypatch):
    from swarmnode import run_view

    folder = nated_node(tmp_path)
    monkeypatch.setattr(run_view, "MAX_TAIL_BYTES", 1200)  # ~4 of the 19 lines
    line = _line(_lines(folder), "who helped since round")
    assert line.startswith("who helped since round 7: "), line


def test_the_status_command_prints_it(tmp_path):
    folder = nated_node(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "swarmnode.cli", "status", "--run-dir", str(folder)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "connection: client mode" in proc.stdout and "who helped: 17" in proc.stdout, proc.stdout
