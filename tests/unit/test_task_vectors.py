"""protocol/vectors/tasks: a task reference becomes this question, answer and these task scores. The
files are what ``make_task_vectors`` makes now, and the regeneration rule PROTOCOL.md states reproduces
each question from reasoning-gym directly (without swarmnode's TaskBank)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import reasoning_gym

from protocol import make_task_vectors

FILES = sorted(make_task_vectors.VECTOR_DIR.glob("*.json"))


def test_committed_task_vectors_are_what_this_code_makes() -> None:
    made = make_task_vectors.build()
    assert sorted(made) == [f.name for f in FILES]
    for f in FILES:
        assert f.read_text() == made[f.name], f"{f.name} is stale: python -m protocol.make_task_vectors"


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
