"""protocol/vectors/tasks: a task reference becomes this question, answer and these task scores. The
files are what ``make_task_vectors`` makes now, and the rules PROTOCOL.md section 5a states reproduce
them from reasoning-gym directly (without swarmnode's TaskBank): each question, the propositional_logic
wrapper's scores, and the task fingerprints of ``vectors/task_fingerprints.json``."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import re

import pytest
import reasoning_gym
from reasoning_gym.logic.propositional_logic import Expression

from protocol import make_task_vectors

FILES = sorted(make_task_vectors.VECTOR_DIR.glob("*.json"))
RESTATEMENTS = make_task_vectors.VECTOR_DIR / f"{make_task_vectors.RESTATEMENTS}.json"


def test_committed_task_vectors_are_what_this_code_makes() -> None:
    made = make_task_vectors.build()
    assert sorted(made) == [f.name for f in FILES]
    for f in FILES:
        assert f.read_text() == made[f.name], f"{f.name} is stale: python -m protocol.make_task_vectors"
    fingerprints = make_task_vectors.FINGERPRINT_FILE
    assert fingerprints.read_text() == make_task_vectors.build_fingerprints(), f"{fingerprints.name} is stale"


def _restates_as_stated(premises: list[str], answer: str) -> bool:
    """PROTOCOL.md section 5a's restatement test, from its words: truth tables over the variables of the
    premises and the answer; (a) a tautology, (b) true wherever one premise alone is, (c) true wherever
    every premise it implies is."""
    parsed = [Expression.from_string(p) for p in premises]
    conclusion = Expression.from_string(answer)
    variables = sorted(set(re.findall(r"[A-Z]", " ".join([*premises, answer]))))
    rows = []
    for values in itertools.product([False, True], repeat=len(variables)):
        assignment = dict(zip(variables, values, strict=True))
        rows.append(([bool(p.evaluate(assignment)) for p in parsed], bool(conclusion.evaluate(assignment))))
    if all(c for _, c in rows):
        return True
    if any(all(c for ps, c in rows if ps[i]) for i in range(len(premises))):
        return True
    implied = [i for i in range(len(premises)) if all(ps[i] for ps, c in rows if c)]
    return all(c for ps, c in rows if all(ps[i] for i in implied))


def test_the_stated_propositional_logic_wrapper_gives_each_task_score() -> None:
    """Above 0.05, reasoning-gym's score becomes 0.05 for a restatement and stands otherwise; the vector
    shows a 0.25 kept (a bare variable that needs two premises) and a 0.25 cut (a tautology)."""
    vector = json.loads(RESTATEMENTS.read_text())
    task, item = vector["task"], vector["item"]
    dataset = reasoning_gym.create_dataset(
        task["dataset"], seed=item["dataset_seed"], size=item["dataset_size"]
    )
    entry = dataset[item["position"]]
    premises = entry["metadata"]["premises"]
    seen = set()
    for c in vector["completions"]:
        rg = dataset.score_answer(c["answer"], entry)
        assert rg == c["dataset_score"], c
        expected = 0.05 if rg > 0.05 and _restates_as_stated(premises, c["answer"]) else rg
        assert c["task_score"] == expected, c
        seen.add((c["dataset_score"], c["task_score"]))
    assert {(0.25, 0.25), (0.25, 0.05), (1.0, 1.0), (1.0, 0.05), (0.05, 0.05), (0.0, 0.0)} <= seen


def test_the_stated_rule_gives_each_task_fingerprint() -> None:
    """The fingerprint from the mix alone: [revision, version, sorted [dataset, canonical config JSON]]
    as Python's json.dumps writes it; a dataset listed without a config has config {}."""
    vectors = json.loads(make_task_vectors.FINGERPRINT_FILE.read_text())
    for mix in vectors["mixes"]:
        configs = sorted(
            [name, json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)]
            for name, config in mix["mix"].items()
        )
        identity = json.dumps([vectors["scorer_revision"], vectors["reasoning_gym_version"], configs])
        assert identity == mix["identity"]
        assert hashlib.sha256(identity.encode()).hexdigest()[:32] == mix["task_fingerprint"]
    default = next(m for m in vectors["mixes"] if m["name"] == "default_mix")
    assert all(config == {} for config in default["mix"].values())


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_stated_rule_regenerates_the_question(path) -> None:
    vector = json.loads(path.read_text())
    task, item = vector["task"], vector["item"]
    assert item["dataset_seed"] == task["seed"] * 2**31 + task["index"] // 4096 * 4096
    assert item["position"] == task["index"] % 4096
    with contextlib.redirect_stdout(io.StringIO()):  # bf prints while generating
        dataset = reasoning_gym.create_dataset(
            task["dataset"], **task["config"], seed=item["dataset_seed"], size=item["dataset_size"]
        )
        entry = dataset[item["position"]]
    assert entry["question"] == vector["question"] and entry["answer"] == vector["answer"]
    scores = [c["task_score"] for c in vector["completions"]]
    assert max(scores) == 1.0 and min(scores) == 0.0  # each vector shows a right and a wrong answer
