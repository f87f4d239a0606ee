"""Issue #26, acceptance 2: under a flood of 512 fresh identities (cards, notices, announcements, DHT
stores, silent holders; four attacker hosts) a 4-node honest swarm keeps pulling the honest batches before
the next round, admits an honest newcomer within a minute, no DHT process dies and memory stays bounded.
The driver and what it measures: benchmarks/reliability/sybil_flood.py; figures in docs/reliability.md.
About 5 minutes on 2 cores: ``pytest -m slow``, or ``python -m benchmarks.sybil_flood``."""

from __future__ import annotations

import json

import pytest

from benchmarks.reliability.sybil_flood import check, run_flood


@pytest.mark.slow
def test_a_flood_of_512_identities_leaves_the_honest_swarm_working(tmp_path):
    report = run_flood(tmp_path, nodes=4, identities=512, hosts=4)
    print(
        f"\nflood: {json.dumps({k: report[k] for k in ('pulled_before_next_round', 'newcomer', 'peak_kib')})}"
    )
    assert check(report) == [], json.dumps(report, indent=1)
