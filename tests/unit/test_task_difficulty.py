"""Step 0's candidates can all be shared in a swarm and build; the measurement is `swarmnode eval`'s
scoring of the untrained model, run here on a tiny in-process model, and the band marks are where stated."""

from __future__ import annotations

import json

from benchmarks.sharing.difficulty import (
    BAND,
    CANDIDATES,
    E2_BAND,
    Candidate,
    Difficulty,
    candidate_tasks,
    measure,
    table,
)
from swarmnode.config import load_config
from swarmnode.evaluate import score_policy
from swarmnode.tasks import AUDITED_ANSWER_CHARS, TaskBank


def test_every_candidate_is_shareable_and_its_answers_fit_the_audited_cap():
    assert {c.dataset for c in CANDIDATES} <= set(AUDITED_ANSWER_CHARS)
    assert len({c.label for c in CANDIDATES}) == len(CANDIDATES)
    base = load_config("node_configs/arithmetic-easy.yaml").tasks
    for candidate in CANDIDATES:
        tasks = candidate_tasks(base, candidate)  # TaskBank refuses a config whose answers pass the cap
        assert list(tasks.mix) == [candidate.dataset] and tasks.eval_seed == base.eval_seed
        TaskBank(tasks)


def test_the_untrained_model_is_scored_as_swarmnode_eval_scores_it(policies):
    cfg = load_config("node_configs/tiny.yaml", {"sampling.max_new_tokens": 4})
    picked = [CANDIDATES[0], next(c for c in CANDIDATES if c.dataset == "propositional_logic")]
    seen = []
    rows = measure(cfg, picked, 3, policy=policies["llama"], on_row=seen.append)
    assert rows == seen and [r.candidate for r in rows] == picked
    for row in rows:
        bank = TaskBank(candidate_tasks(cfg.tasks, row.candidate))
        expected = score_policy(policies["llama"], bank, bank.eval_refs(3), max_new_tokens=4,
                                system_prompt=cfg.sampling.system_prompt)[row.candidate.dataset]  # fmt: skip
        assert (row.pass1, row.score, row.format, row.questions) == (
            expected["pass@1"],
            expected["score"],
            expected["format"],
            3,
        )
    assert (
        json.loads(json.dumps([r.as_dict() for r in rows]))[0]["candidate"]["dataset"] == "basic_arithmetic"
    )


def test_the_bands_are_marked_inclusively():
    def row(pass1: float) -> Difficulty:
        return Difficulty(Candidate("x", "basic_arithmetic"), 200, pass1, pass1, 1.0, 1.0)

    marks = {
        p: (row(p).in_band, row(p).in_e2_band) for p in (0.05, BAND[0], 0.12, E2_BAND[1], 0.3, BAND[1], 0.5)
    }
    assert marks == {0.05: (False, False), 0.10: (True, True), 0.12: (True, True), 0.15: (True, True),
                     0.3: (True, False), 0.40: (True, False), 0.5: (False, False)}  # fmt: skip
    text = table([row(0.12), row(0.3), row(0.5)])
    assert [line.rsplit("|", 2)[1].strip() for line in text.splitlines()[2:5]] == ["**", "*", ""]
