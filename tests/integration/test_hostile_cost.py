"""A hostile peer's costliest valid batch against a real node: it costs the receiver no more than its
scoring budget, the sender is struck, and the round ends within its deadline plus that budget.

The attacker (``hostile_peer.py costly``: its own process, real hivemind) sends one honestly claimed
~4 MiB batch, 64 groups of 64 completions whose answers are the costliest propositional_logic answer at
the receiver's answer cap. Before the budget, a batch like it (at the wire's 16 KiB per text) cost a
node about a CPU-hour to score. The receiver runs G = 16 and 64 new tokens, so it keeps 16 completions
per group (1024 answers, ~7 s of CPU to score them all) and every text fits its cap: only the budget
stops it.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid

import pytest

from benchmarks.harness.processes import start_node
from swarmnode.swarm.exchange.verify import SCORE_BUDGET_CPU_S, SCORE_BUDGET_WALL_S
from swarmnode.swarm.wire import limits
from tests.helpers.swarm_procs import start_hostile

DEADLINE_S = 4.0
SLACK_S = 2.0  # a poll or a fetch may still be finishing when the budget runs out
ONE_ANSWER_S = 0.05  # the check runs before each answer: the overshoot is one answer (audited < 0.01 s)
ROUNDS = 4


@pytest.mark.slow
def test_a_4_mib_batch_of_worst_case_answers_costs_at_most_the_budget(tmp_path):
    swarm_id = f"cost-{uuid.uuid4().hex[:10]}"
    honest = start_node(
        tmp_path / "honest",
        "--config", "node_configs/tiny.yaml",
        "--rounds", str(ROUNDS),
        "--set", f"swarm.swarm_id={swarm_id}",
        "--set", "swarm.min_peers=1",
        "--set", "swarm.wait_for_peers_s=180",
        "--set", f"swarm.share_deadline_s={DEADLINE_S}",
        "--set", "sampling.completions_per_question=16",
        "--set", "sampling.max_new_tokens=64",
    )  # fmt: skip
    hostile = None
    try:
        hostile = start_hostile("costly", tmp_path / "hostile", swarm_id, honest.address())
        peer = json.loads(hostile.wait_for_line("READY ", 180).split(" ", 1)[1])["peer_id"]
        assert honest.wait(timeout_s=300) == 0, honest.output()
        report = hostile.report(timeout_s=90)
    finally:
        if hostile is not None:
            with contextlib.suppress(OSError):
                hostile.proc.stdin.close()
            hostile.close()
        honest.stop()

    [step] = [s for s in report["steps"] if s["name"] == "costly"]
    assert step["served"] == 1, report  # the honest node pulled all of it
    assert 3.5 * 2**20 < step["bytes"] <= limits.MAX_FRAME_BYTES

    status = honest.status()
    assert status["rejected"] == {"over_budget": 1}, status
    [line] = [line for line in honest.lines if "ran over budget" in line]
    cpu, wall = (float(x) for x in re.search(r"([\d.]+) s CPU, ([\d.]+) s wall", line).groups())
    print(f"\nreceiver spent {cpu:.3f} s CPU, {wall:.3f} s wall on the {step['bytes']} byte batch; {line}")
    assert cpu <= SCORE_BUDGET_CPU_S + ONE_ANSWER_S and wall <= SCORE_BUDGET_WALL_S + ONE_ANSWER_S
    assert peer in line and line.endswith("sender charged")

    metrics = honest.metrics()
    assert [r["round"] for r in metrics] == list(range(1, ROUNDS + 1))
    shares = [round(r["seconds_share"], 2) for r in metrics]
    print(f"seconds_share per round: {shares}")
    assert max(shares) <= DEADLINE_S + SCORE_BUDGET_WALL_S + SLACK_S
    trained = (
        (honest.run_dir / "peer_groups.jsonl").read_text()
        if (honest.run_dir / "peer_groups.jsonl").exists()
        else ""
    )
    assert peer not in trained
