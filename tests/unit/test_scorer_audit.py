"""The scorer audit: every dataset a swarm node may accept from peers (``tasks.AUDITED_DATASETS``) is
scored on adversarial answers within a CPU-time and a memory bound, and gives them no reward.

Peers choose the completion text, hence the answer a scorer parses. A dataset is audited when its
scorer, given any answer up to its length cap (``tasks.answer_char_limit``), costs at most
``AUDIT_CPU_S`` of CPU and ``AUDIT_MEMORY_BYTES`` of allocations, and scores the answers below (none
of them right) at most ``AUDIT_MAX_SCORE``. Datasets known to fail (loops over answer digits, huge
allocations, any-answer-wins scorers, code evaluation) must stay off the list.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest

from swarmnode.config import SAPO_TASKS, TasksConfig, TaskSpec
from swarmnode.errors import TaskError
from swarmnode.rollouts import TaskRef
from swarmnode.tasks import AUDITED_DATASETS, CODE_EVAL_SCORERS, TaskBank, answer_char_limit

AUDIT_CPU_S = 0.1  # per answer, CPU seconds of the scoring thread
AUDIT_MEMORY_BYTES = 32 * 1024 * 1024  # per answer, peak Python allocations
AUDIT_MAX_SCORE = 0.1  # none of the adversarial answers is right: at most partial credit this low
KNOWN_UNSAFE = {"rush_hour", "rubiks_cube", "game_of_life_halting", *CODE_EVAL_SCORERS}


def adversarial(limit: int) -> list[str]:
    """Answers at the cap that have cost a scorer time or memory, or won reward, somewhere."""
    n = limit
    return [
        "9" * n,  # a huge number (loops or allocations sized by the answer's value)
        ("(" * n)[: n // 2] + "P ∨ ¬P" + (")" * n)[: n // 2 - 6],  # deep nesting of a tautology
        ("P ∧ " * n)[: n - 1] + "P",  # long chains (quadratic parsers)
        ("[" * n)[: n // 2] + ("]" * n)[: n // 2],  # deep Python-list nesting (literal_eval)
        ("-1e99999 " * n)[:n],
        ("R1000000000 " * n)[:n],  # move counts (rubiks_cube allocates [move] * count)
        ("0 1 " * n)[:n],
        ("\u202e\u0000☃" * n)[:n],  # control and non-ASCII characters
        ("+" * n)[:n],
        ("(((" + "A ↔ " * n)[:n],
    ]


@pytest.fixture(scope="module")
def bank() -> TaskBank:
    return TaskBank(TasksConfig(mix={name: TaskSpec() for name in sorted(AUDITED_DATASETS)}, seed=5))


def test_known_unsafe_datasets_are_not_audited() -> None:
    assert not AUDITED_DATASETS & KNOWN_UNSAFE
    assert set(SAPO_TASKS) <= AUDITED_DATASETS  # the default mix runs in a swarm


@pytest.mark.parametrize("name", sorted(AUDITED_DATASETS))
def test_audited_scorer_is_cheap_and_unrewarding_on_adversarial_answers(bank: TaskBank, name: str) -> None:
    limit = answer_char_limit(name)
    worst_cpu, worst_mem = 0.0, 0
    for index in range(3):
        question = bank.question(TaskRef.make(name, 5, index))
        for answer in adversarial(limit):
            text = f"<answer>{answer}</answer>"
            t0 = time.thread_time()
            score = bank.score(question, text)[1]
            cpu = time.thread_time() - t0
            tracemalloc.start()  # a second run for memory: tracing slows the first one's clock
            bank.score(question, text)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            worst_cpu, worst_mem = max(worst_cpu, cpu), max(worst_mem, peak)
            assert score <= AUDIT_MAX_SCORE, (name, answer[:40], score)
    print(f"\n{name}: cap {limit} chars, worst {worst_cpu * 1000:.1f} ms CPU, {worst_mem / 1e6:.1f} MB")
    assert worst_cpu <= AUDIT_CPU_S, (name, worst_cpu)
    assert worst_mem <= AUDIT_MEMORY_BYTES, (name, worst_mem)


def test_an_answer_over_its_cap_scores_zero_without_reaching_the_scorer(bank: TaskBank, monkeypatch) -> None:
    question = bank.question(TaskRef.make("basic_arithmetic", 5, 0))
    limit = answer_char_limit("basic_arithmetic")
    padded = question.answer.rjust(limit + 1, "0")  # numerically right, but over the cap
    calls = []
    dataset = bank._dataset(question.ref)
    monkeypatch.setattr(dataset, "score_answer", lambda *a: calls.append(a) or 1.0)
    assert bank.score(question, f"<answer>{padded}</answer>")[1] == 0.0
    assert calls == []


@pytest.mark.parametrize("name", sorted(AUDITED_DATASETS))
def test_honest_answers_fit_well_within_the_cap(bank: TaskBank, name: str) -> None:
    longest = 0
    for index in range(200):
        question = bank.question(TaskRef.make(name, 6, index))
        answer = question.answer
        if answer is None:  # propositional_logic: scored from metadata
            answer = question.entry["metadata"]["example_answer"]
        longest = max(longest, len(answer))
    assert 2 * longest <= answer_char_limit(name), (name, longest)


def test_a_config_whose_answers_outgrow_the_cap_is_refused() -> None:
    big = TaskSpec(config={"min_n": 40, "max_n": 40})  # 40 x 40 matrices: answers of ~3200 characters
    with pytest.raises(TaskError, match="tasks.mix.binary_matrix.*answer"):
        TaskBank(TasksConfig(mix={"binary_matrix": big}, seed=1))
