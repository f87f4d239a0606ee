"""Issue #45, acceptance 2: real processes, 4 honest ``swarmnode join`` nodes and ONE hostile process holding
256 identities with the swarm's identity work (canned text that scores, silent, future-dated, newcomer
churn) on loopback: at least 90% of every honest node's trained peer groups come from honest peers, and no
honest round's share phase runs past its deadline. The driver and what it measures:
benchmarks/reliability/sybil_mix.py. About 5 minutes on 2 cores: ``pytest -m slow``, or
``python -m benchmarks.sybil_flood --mix``."""

from __future__ import annotations

import json

import pytest

from benchmarks.reliability.sybil_mix import check, run_mix


@pytest.mark.slow
def test_a_mix_of_256_sybil_identities_in_one_process_leaves_the_honest_nodes_training_on_honest_groups(
    tmp_path,
):
    report = run_mix(tmp_path, nodes=4, identities=256)
    summary = {
        name: {key: node[key] for key in ("trained", "honest_share", "share_phase")}
        for name, node in report["per_node"].items()
    }
    print(f"\nmix: {json.dumps(summary)}")
    assert check(report) == [], json.dumps(report, indent=1)
