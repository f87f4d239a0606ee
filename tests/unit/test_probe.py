"""The fixed probe: the same held-out questions in every arm, scored as ``swarmnode eval`` scores, at
round 0, every ``probe.every_rounds`` rounds and after the last, one probe.jsonl line each, never twice."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from swarmnode.config import NodeConfig, load_config
from swarmnode.probe import PROBE_FILE, probe_refs
from swarmnode.rollouts import TaskRef
from swarmnode.tasks import TaskBank

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "node_configs" / "tiny.yaml"
PER_TASK = 6
# tiny.yaml's mix plus a dataset this node never samples: probed all the same. fraction_simplification
# gives partial credit to any answer, so the untrained tiny model's scores are not all 0 and comparing
# two computations of them compares numbers, not zeros.
PROBED = {
    "tasks.seed": 5,
    "tasks.mix.fraction_simplification": {"weight": 0},
    "probe.every_rounds": 2,
    "probe.questions_per_task": PER_TASK,
    "run.metrics_port": None,
}
LINE_KEYS = {"round", "questions_per_task", "by_task", "pass@1", "score", "seconds"}


def _bank(cfg: NodeConfig, stream_seed: int) -> TaskBank:
    return TaskBank(cfg.tasks, default_seed=stream_seed)  # as a node builds it (seed from its peer id)


def _asked(cfg: NodeConfig, stream_seed: int) -> dict[str, list[TaskRef]]:
    """The refs a node's probe asks (it is handed no policy or log: asking needs neither)."""
    from swarmnode.probe import Probe

    return Probe(cfg, _bank(cfg, stream_seed), policy=None, runlog=None).refs


def test_every_arm_is_probed_on_the_same_questions() -> None:
    third = "tasks.mix.fraction_simplification"
    base = load_config(TINY, {third: {}, "probe.questions_per_task": 4})
    arms = [
        load_config(TINY, {third: {"weight": 0}, "sampling.questions_per_round": 2}),
        load_config(TINY, {third: {}, "tasks.mix.propositional_logic": {"weight": 0}}),
        load_config(TINY, {third: {"weight": 5}, "tasks.seed": 11, "swarm.peer_groups_per_round": 0,
                           "swarm.swarm_id": "other"}),
    ]  # fmt: skip
    expected = _asked(base, 1)
    assert sorted(expected) == ["basic_arithmetic", "fraction_simplification", "propositional_logic"]
    for refs in expected.values():
        assert len(refs) == 4 and {ref.seed for ref in refs} == {base.tasks.eval_seed}
    bank = _bank(base, 1)
    texts = {task: [bank.question(ref).text for ref in refs] for task, refs in expected.items()}
    for i, arm in enumerate(arms):
        asked = _asked(arm, 1000 + i)  # 32 questions a task: the default
        assert {task: refs[:4] for task, refs in asked.items()} == expected  # the first N: a prefix
        assert all(len(refs) == 32 for refs in asked.values())
        bank = _bank(arm, 1000 + i)
        assert {task: [bank.question(ref).text for ref in refs[:4]] for task, refs in asked.items()} == texts
    assert _asked(base, 1) == probe_refs(_bank(base, 2), 4)


@dataclass
class Probed:
    run_dir: Path
    cfg: NodeConfig
    after_three: list[dict]  # probe.jsonl after a fresh 3-round run
    after_resume: list[dict]  # ... after resuming it up to round 4
    after_restart: list[dict]  # ... after starting it again with nothing left to run
    weights: dict[int, list[str]]  # round -> digests of the weights each probe of it scored


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / PROBE_FILE).read_text().splitlines()]


def _run(cfg: NodeConfig) -> None:
    from swarmnode.node import Node

    node = Node(cfg)
    try:
        node.run()
    finally:
        node.close()


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> Probed:
    from swarmnode.policy import state_digest
    from swarmnode.probe import Probe

    weights: dict[int, list[str]] = {}
    probe_run = Probe.run

    def run_and_note_weights(self: Probe, round_: int):
        weights.setdefault(round_, []).append(state_digest(self.policy.model))
        return probe_run(self, round_)

    run_dir = tmp_path_factory.mktemp("probed")
    cfg = load_config(TINY, {**PROBED, "run.run_dir": str(run_dir), "run.rounds": 3})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Probe, "run", run_and_note_weights)
        _run(cfg)
        after_three = _lines(run_dir)
        _run(load_config(TINY, {**PROBED, "run.run_dir": str(run_dir), "run.rounds": 4}))
        after_resume = _lines(run_dir)
        _run(load_config(TINY, {**PROBED, "run.run_dir": str(run_dir), "run.rounds": 4}))
    return Probed(run_dir, cfg, after_three, after_resume, _lines(run_dir), weights)


def test_a_run_is_probed_at_round_0_every_k_rounds_and_at_the_end(probed: Probed) -> None:
    assert [line["round"] for line in probed.after_three] == [0, 2, 3]
    for line in probed.after_three:
        assert set(line) == LINE_KEYS and line["questions_per_task"] == PER_TASK
        rows = line["by_task"]
        assert sorted(rows) == ["basic_arithmetic", "fraction_simplification", "propositional_logic"]
        for row in rows.values():
            assert set(row) == {"pass@1", "score", "format"} and all(0 <= v <= 1 for v in row.values())
        assert line["pass@1"] == pytest.approx(sum(r["pass@1"] for r in rows.values()) / 3)
        assert line["score"] == pytest.approx(sum(r["score"] for r in rows.values()) / 3)
        assert line["seconds"] > 0


def test_a_resumed_run_does_not_probe_a_round_twice(probed: Probed) -> None:
    assert [line["round"] for line in probed.after_resume] == [0, 2, 3, 4]
    assert probed.after_resume[:3] == probed.after_three
    assert probed.after_restart == probed.after_resume  # nothing left to run: nothing probed


def test_each_probe_scores_the_weights_its_round_left(probed: Probed) -> None:
    """Round r's probe sees round r's checkpoint (0: the initial model), not the weights of a round
    before or after it."""
    from swarmnode import checkpoint
    from swarmnode.policy import load_policy, state_digest

    assert sorted(probed.weights) == [0, 2, 3, 4] and all(len(d) == 1 for d in probed.weights.values())
    for r, [digest] in probed.weights.items():
        policy = load_policy(probed.cfg.model, seed=probed.cfg.train.seed)
        if r:
            info = checkpoint.validate(probed.run_dir / "checkpoints" / f"round-{r:06d}")
            checkpoint.load_model_weights(info, policy.model)
        assert state_digest(policy.model) == digest, f"round {r}"
    assert probed.weights[4] != probed.weights[0]  # the run trained: the rounds' weights differ


def test_the_probe_scores_as_swarmnode_eval_does(probed: Probed, tmp_path: Path) -> None:
    from swarmnode.evaluate import evaluate_checkpoint

    untrained = load_config(TINY, {**PROBED, "run.run_dir": str(tmp_path)})  # no checkpoint: initial model
    compared = 0
    for line in probed.after_resume:
        r = line["round"]
        if r == 0:
            report = evaluate_checkpoint(untrained, None, PER_TASK)
        else:
            checkpoint = probed.run_dir / "checkpoints" / f"round-{r:06d}"
            report = evaluate_checkpoint(probed.cfg, checkpoint, PER_TASK)
        assert line["by_task"] == report, f"round {r}"
        compared += 1
    assert compared == 4
    assert any(row["score"] > 0 for line in probed.after_resume for row in line["by_task"].values())


def test_probing_draws_no_randomness_and_survives_a_write_failure(policies, tmp_path: Path) -> None:
    import torch

    from swarmnode.common import WriteFailures
    from swarmnode.probe import Probe
    from swarmnode.runlog import RunLog

    cfg = load_config(TINY, {**PROBED, "run.run_dir": str(tmp_path)})
    (tmp_path / PROBE_FILE).mkdir()  # appending to it fails as a full disk would
    failures = WriteFailures()
    probe = Probe(cfg, _bank(cfg, 0), policies["llama"], RunLog(tmp_path, PROBE_FILE, failures))
    before = torch.random.get_rng_state()
    result = probe.run(0)
    assert torch.equal(torch.random.get_rng_state(), before)  # a probe leaves the run's random stream alone
    assert failures.count == 1 and result.round == 0 and set(result.as_dict()) == LINE_KEYS


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_answers_come_back_in_the_prompts_order_whatever_the_batching(policies, family: str) -> None:
    """Batches are taken in order of prompt length: each prompt still gets its own completion, the same
    as decoded alone."""
    from swarmnode.evaluate import greedy_texts

    policy = policies[family]
    vocab = policy.tokenizer.vocab_size
    lengths = [9, 3, 14, 5, 3, 11, 7]  # unsorted, with a tie
    prompts = [[(17 * i + 5 * j) % (vocab - 10) + 5 for j in range(n)] for i, n in enumerate(lengths)]
    alone = [greedy_texts(policy, [prompt], 6)[0] for prompt in prompts]
    assert len(set(alone)) > 1  # the prompts' completions differ: a mix-up would show
    assert greedy_texts(policy, prompts, 6, batch_size=3) == alone
    assert greedy_texts(policy, prompts, 6) == alone
