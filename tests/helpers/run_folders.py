"""Run folders as a swarm node leaves them (metrics.jsonl, status.json, peer_groups.jsonl), written by
hand for the tests of ``swarmnode status`` and the status page."""

from __future__ import annotations

import json
import time
from pathlib import Path

OURS = "12D3KooWours"
RELAY = "12D3KooWrelay"  # in the roster: the node it connects through
HELPER = "12D3KooWhelper"  # not in the roster (behind NAT too): this node trained on its groups
TOKENIZER = "e434879d22abd3a2"


def round_record(round_: int, reward: float = 0.25) -> dict:
    return {
        "round": round_, "policy_version": round_, "reward_mean": reward, "reward_peer_mean": reward / 2,
        "format_rate": 0.75, "groups_local": 4, "groups_peer": 2, "groups_kept": 5, "seconds_sample": 1.5,
        "seconds_score": 0.1, "seconds_share": 0.4, "seconds_train": 2.0, "seconds_sync": 0.0,
        "seconds_total": 4.0, "train_loss": 0.1,
    }  # fmt: skip


def status_json(**changes) -> dict:
    """status.json of a NATed node (client mode) at round 8 whose roster holds only the relay."""
    status = {
        "peer_id": OURS, "swarm_id": "s", "addrs": ["/ip4/10.0.0.2/tcp/1"], "round": 8, "policy_version": 8,
        "model": "tiny-llama", "tokenizer": TOKENIZER, "connected": 1, "updated": time.time(),
        "peers": {RELAY: {"model": "tiny-qwen2", "tokenizer": "77aa00112233ffee", "policy_version": 7,
                          "round": 8, "seen_s_ago": 4.0, "banned": False, "standing": True}},
        "rollouts": {"groups_published": 32, "batches_published": 8, "batches_received": 9,
                     "groups_accepted": 36, "groups_trained": 17},
        "arrival_s": {"count": 0, "sum": 0.0}, "rejected": {"reward_mismatch": 2}, "fetch_failures": {},
        "pulls_by_source": {"notice": 3, "holder": 12}, "client_mode": True, "reachability": "unreachable",
        "bans": [],
    }  # fmt: skip
    return {**status, **changes}


def peer_group(round_: int, producer: str, model: str = "tiny-llama") -> dict:
    return {
        "round": round_, "producer": producer, "producer_round": round_, "policy_version": round_ - 1,
        "model": model, "task": '["basic_arithmetic", {}, 1, 2]', "completions": 4, "texts_sha256": "ab" * 32,
    }  # fmt: skip


def write_run_folder(
    folder: Path, rounds: list[dict], status: dict | None = None, groups: list[dict] = ()
) -> Path:
    """``folder`` with those files (status.json only when ``status`` is given)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    if status is not None:
        (folder / "status.json").write_text(json.dumps(status))
    if groups:
        (folder / "peer_groups.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))
    return folder


def nated_node(folder: Path) -> Path:
    """A NATed node at round 8: the relay in its roster, 15 groups trained from a peer not in it, 2 from
    the relay."""
    groups = [peer_group(r, HELPER) for r in range(2, 9) for _ in range(2)] + [peer_group(8, HELPER)]
    groups += [peer_group(5, RELAY, "tiny-qwen2"), peer_group(7, RELAY, "tiny-qwen2")]
    groups.sort(key=lambda g: g["round"])  # appended round by round
    return write_run_folder(folder, [round_record(r) for r in range(1, 9)], status_json(), groups)
