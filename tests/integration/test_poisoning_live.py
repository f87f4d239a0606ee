"""#46 item 3: the poisoning harness over the network (benchmarks/poisoning/live.py): a real ``swarmnode
join`` node and the attacker's own process on loopback. The node finds the attackers' batches by notice,
pulls, verifies and trains on them as on any peer's, and the measures follow its checkpoints. About a
minute and a half on 2 cores (two processes with hivemind): ``pytest -m slow``."""

from __future__ import annotations

import json

import pytest

from benchmarks.harness.processes import read_jsonl
from benchmarks.poisoning.live import run_live
from benchmarks.poisoning.run import ArmSpec

TINY_SETS = ("sampling.max_new_tokens=64", "probe.questions_per_task=2")  # as the harness's tiny trial


@pytest.mark.slow
def test_a_real_node_pulls_verifies_and_trains_on_the_attackers_batches(tmp_path):
    spec = ArmSpec(
        defence="span_drift_recurring", payload="credentials", rounds=4, every=2, questions=2, prompts=2,
        greedy=4, config="node_configs/tiny.yaml", sets=TINY_SETS,
    )  # fmt: skip
    path = run_live(spec, tmp_path / "work", tmp_path / "summaries", {})
    summary = json.loads(path.read_text())
    assert summary["live"] and summary["complete"]
    assert [c["round"] for c in summary["checkpoints"]] == [0, 2, 4]
    assert [p["round"] for p in summary["published"]] == [1, 2, 3, 4]  # one publication per node round

    # every attacker batch verified (no rejection), and the node trained on the attackers' groups
    assert summary["rejections"] == {} and summary["accepted_groups"] > 0
    trained = read_jsonl(tmp_path / "work" / "node" / "peer_groups.jsonl")
    assert trained and {g["producer"] for g in trained} <= set(summary["attacker_peer_ids"])
    assert sum(r["groups_peer"] for r in summary["rounds"]) == len(trained)
