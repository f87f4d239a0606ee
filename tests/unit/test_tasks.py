"""TaskBank against real reasoning-gym: regeneration, oracle scoring, ref checks, drawing."""

import json
from collections import Counter

import pytest

from swarmnode.config import DRAW_STRIDE, SAPO_TASKS, TasksConfig, TaskSpec
from swarmnode.errors import TaskError
from swarmnode.prompts import DEFAULT_SYSTEM_PROMPT, prompt_messages
from swarmnode.rollouts import TaskRef
from swarmnode.tasks import INDEX_LIMIT, Question, TaskBank, extract_answer
from tests.helpers.oracles import oracle

ADDITION = {"min_terms": 2, "max_terms": 2, "operators": ["+"]}


@pytest.fixture(scope="module")
def bank() -> TaskBank:
    return TaskBank(TasksConfig(format_reward=0.25))


def wire(ref: TaskRef) -> TaskRef:
    """The ref as a peer would rebuild it from its canonical string."""
    dataset, config, seed, index = json.loads(ref.key())
    return TaskRef.make(dataset, seed, index, config)


def test_question_regenerates_from_ref_in_a_fresh_bank(bank: TaskBank) -> None:
    refs = bank.draw(round=3, count=12)
    fresh = TaskBank(TasksConfig())
    for ref in refs:
        first, again = bank.question(ref), fresh.question(wire(ref))
        assert (again.text, again.answer) == (first.text, first.answer)
        assert again.ref == ref


def test_question_with_a_config_regenerates_and_uses_the_config() -> None:
    tasks = TasksConfig(mix={"basic_arithmetic": TaskSpec(config=ADDITION)})
    refs = TaskBank(tasks).draw(round=0, count=5)
    fresh = TaskBank(tasks)
    for ref in refs:
        assert ref.config_dict() == ADDITION
        question = TaskBank(tasks).question(ref)
        again = fresh.question(wire(ref))
        assert (again.text, again.answer) == (question.text, question.answer)
        assert question.entry["metadata"]["num_terms"] == 2
        assert "+" in question.entry["metadata"]["expression"]


def test_seeds_and_chunks_never_share_an_item(bank: TaskBank) -> None:
    # reasoning-gym alone makes (seed s, index i) the same item as (s + 1, i - 1)
    texts = [
        bank.question(TaskRef.make("basic_arithmetic", seed, index)).text
        for seed, index in [(0, 1), (1, 0), (0, 4095), (0, 4096), (7, 2**31 - 1)]
    ]
    assert len(set(texts)) == len(texts)


@pytest.mark.parametrize("name", SAPO_TASKS)
def test_oracle_scores_one_and_empty_scores_zero(bank: TaskBank, name: str) -> None:
    answered = 0
    for ref in bank.eval_refs(per_task=8)[name]:
        question = bank.question(ref)
        answer = oracle(question, bank)
        if answer is None:  # propositional_logic items whose every consequence restates a premise
            continue
        answered += 1
        assert bank.score(question, f"<answer>{answer}</answer>") == (1.25, 1.0, True)
        assert bank.score(question, "<answer></answer>") == (0.25, 0.0, True)
        assert bank.score(question, "") == (0.0, 0.0, False)
    assert answered >= 3


def _logic_question(bank: TaskBank, premises: list[str], variables: list[str]) -> Question:
    """A real propositional_logic question with its premises replaced (scoring reads only metadata)."""
    question = bank.question(TaskRef.make("propositional_logic", 0, 0))
    metadata = {**question.entry["metadata"], "premises": premises, "variables": variables}
    return Question(question.ref, question.text, None, {**question.entry, "metadata": metadata})


@pytest.mark.parametrize(
    "answer",
    ["P", "(P → Q)", "(P ∧ P)", "((P → Q) ∧ P)", "(P ∧ (P → Q))", "(P ∧ Q)", "(P ∨ Q)", "¬¬P",
     "(P ∨ ¬P)", "((((Q ∨ ¬Q))))"],
)  # fmt: skip
def test_propositional_logic_restating_premises_earns_nothing(bank: TaskBank, answer: str) -> None:
    """reasoning-gym scores any valid conclusion 1.0, so restating a premise, AND-ing the premises or
    weakening one (P ∨ Q from P) won full reward, and tautologies 0.25: a learner would learn to copy."""
    question = _logic_question(bank, ["(P → Q)", "P"], ["P", "Q"])
    assert bank.score(question, f"<answer>{answer}</answer>")[1] <= 0.05


def test_propositional_logic_a_real_derivation_earns_full_reward(bank: TaskBank) -> None:
    question = _logic_question(bank, ["(P → Q)", "P", "(Q → R)"], ["P", "Q", "R"])
    for answer in ("(Q ∧ R)", "(R ∧ P)", "(R ∨ R)"):  # modus ponens, twice: needs two premises or more
        assert bank.score(question, f"<answer>{answer}</answer>")[1] == 1.0
    assert bank.score(question, "<answer>R</answer>")[1] == 0.25  # reasoning-gym's score for a bare atom
    assert bank.score(question, "<answer>¬R</answer>")[1] == 0.05  # does not follow: reasoning-gym's 0.05


def test_format_reward_only_with_tags(bank: TaskBank) -> None:
    question = bank.question(TaskRef.make("basic_arithmetic", 0, 3))
    assert bank.score(question, f"The answer is {question.answer}.") == (1.0, 1.0, False)
    assert bank.score(question, f"Think.\n<answer>{question.answer}</answer>") == (1.25, 1.0, True)
    assert bank.score(question, "<answer>not a number</answer>") == (0.25, 0.0, True)


def test_partial_scores_stay_in_range(bank: TaskBank) -> None:
    question = bank.question(TaskRef.make("fraction_simplification", 0, 0))
    reward, task_score, format_ok = bank.score(question, "<answer>no idea</answer>")
    assert 0.0 < task_score < 1.0  # reasoning-gym's own partial credit, passed through
    assert (reward, format_ok) == (task_score + 0.25, True)


def test_binary_matrix_answers_are_never_executed(bank: TaskBank, tmp_path) -> None:
    question = bank.question(TaskRef.make("binary_matrix", 0, 0))
    target = tmp_path / "pwned"
    assert bank.score(question, f"<answer>open({str(target)!r}, 'w').write('x')</answer>")[1] == 0.0
    assert not target.exists()
    # a Python-list answer still gets reasoning-gym's partial credit
    assert bank.score(question, f"<answer>{question.entry['metadata']['solution']}</answer>")[1] == 0.1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>1</answer> no, <answer> 2 </answer>", ("2", True)),
        ("<answer>\n0 1\n1 0\n</answer>", ("0 1\n1 0", True)),
        ("<answer></answer>", ("", True)),
        ("The answer is 7.", ("7", False)),
        ("Let me see.\nAnswer: 42\nDone", ("42", False)),
        ("the final answer is: 5", ("5", False)),
        ("I think it is\n\n12.\n\n", ("12", False)),
        ("</answer> 3 <answer>", ("</answer> 3 <answer>", False)),
        ("", ("", False)),
    ],
)
def test_extract_answer(text: str, expected: tuple[str, bool]) -> None:
    assert extract_answer(text) == expected


def test_prompt_states_the_format() -> None:
    system, example_q, example_a, user = prompt_messages("What is 1 + 1?")
    assert system == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    assert "<answer>" in DEFAULT_SYSTEM_PROMPT and "</answer>" in DEFAULT_SYSTEM_PROMPT
    # the example turn shows the rewarded format and scores as well-formed
    assert (example_q["role"], example_a["role"]) == ("user", "assistant")
    assert extract_answer(example_a["content"]) == ("7", True)
    assert user == {"role": "user", "content": "What is 1 + 1?"}
    assert prompt_messages("q", system_prompt="Be terse.")[0]["content"] == "Be terse."


def test_unknown_dataset_names_the_field_and_suggests() -> None:
    with pytest.raises(TaskError, match=r"tasks\.mix\.basic_arithmatic: .*basic_arithmetic"):
        TaskBank(TasksConfig(mix={"basic_arithmatic": TaskSpec()}))


@pytest.mark.parametrize(
    ("name", "config", "field"),
    [
        ("basic_arithmetic", {"min_terms": 0}, r"tasks\.mix\.basic_arithmetic\.config: min_terms"),
        ("bf", {"difficult": 2}, r"tasks\.mix\.bf\.config: .*difficult"),
        ("bf", {"seed": 3}, r"tasks\.mix\.bf\.config\.seed"),
    ],
)
def test_bad_config_names_the_dataset(name: str, config: dict, field: str) -> None:
    with pytest.raises(TaskError, match=field):
        TaskBank(TasksConfig(mix={name: TaskSpec(config=config)}))


def test_check_ref_rejects_what_this_node_did_not_choose() -> None:
    bank = TaskBank(TasksConfig(mix={"basic_arithmetic": TaskSpec(config=ADDITION), "bf": TaskSpec()}))
    for ref in bank.draw(round=0, count=8):
        bank.check_ref(wire(ref))
    bad = [
        TaskRef.make("leg_counting", 0, 0),  # a reasoning-gym dataset, but not in the mix
        TaskRef.make("no_such_dataset", 0, 0),
        TaskRef.make("basic_arithmetic", 0, 0),  # configured differently here
        TaskRef.make("basic_arithmetic", 0, 0, {**ADDITION, "max_terms": 3}),
        TaskRef.make("bf", 0, -1),
        TaskRef.make("bf", 0, 2**31),
        TaskRef.make("bf", -1, 0),
        TaskRef.make("bf", 2**63, 0),
        TaskRef(dataset="bf", seed=True, index=0),
    ]
    for ref in bad:
        with pytest.raises(TaskError):
            bank.check_ref(ref)
        with pytest.raises(TaskError):
            bank.question(ref)


def test_draw_is_deterministic_and_fresh_each_round() -> None:
    tasks = TasksConfig(mix={"bf": TaskSpec(weight=1.0), "basic_arithmetic": TaskSpec(weight=9.0)}, seed=5)
    bank = TaskBank(tasks)
    assert bank.draw(2, 6) == TaskBank(tasks).draw(2, 6)
    assert len(bank.draw(2, 6)) == 6 and bank.draw(2, 0) == []
    assert all(ref.seed == 5 for ref in bank.draw(2, 6))
    assert bank.draw(2, 6, seed=6) != bank.draw(2, 6)
    refs = [ref for round in range(50) for ref in bank.draw(round, 8)]
    assert len({ref.key() for ref in refs}) == len(refs)
    counts = Counter(ref.dataset for ref in refs)
    assert set(counts) == {"bf", "basic_arithmetic"}
    assert 0.8 < counts["basic_arithmetic"] / len(refs) < 0.97


def test_question_j_of_a_round_does_not_depend_on_how_many_are_drawn() -> None:
    """Nodes that sample 2 and 4 questions a round see the same first 2 (arms of an experiment differ in
    questions_per_round, not in which questions they are asked)."""
    tasks = TasksConfig(mix={"bf": TaskSpec(weight=1.0), "basic_arithmetic": TaskSpec(weight=2.0)})
    bank = TaskBank(tasks)
    for seed in (0, 1, 5, 2**40 + 3):
        for round in range(40):
            four = bank.draw(round, 4, seed=seed)
            assert four[:2] == bank.draw(round, 2, seed=seed)
            assert four[:1] == bank.draw(round, 1, seed=seed)
            assert bank.draw(round, 9, seed=seed)[:4] == four


def test_questions_of_different_rounds_never_repeat_whatever_the_counts() -> None:
    bank = TaskBank(TasksConfig(mix={"bf": TaskSpec(), "basic_arithmetic": TaskSpec()}, seed=3))
    refs = [ref for round in range(60) for ref in bank.draw(round, 1 + round % 7)]
    assert len({ref.key() for ref in refs}) == len(refs)
    assert bank.draw(2, DRAW_STRIDE)[-1].index == 3 * DRAW_STRIDE - 1  # a full round stops below the next


def test_draw_range_is_checked() -> None:
    bank = TaskBank(TasksConfig(mix={"bf": TaskSpec()}, seed=3))
    last_round = INDEX_LIMIT // DRAW_STRIDE - 1
    assert bank.draw(last_round, 2)[-1].index == last_round * DRAW_STRIDE + 1 < INDEX_LIMIT
    for round, count in ((last_round + 1, 1), (0, DRAW_STRIDE + 1), (-1, 1), (0, -1)):
        with pytest.raises(ValueError, match="out of range"):
            bank.draw(round, count)


def test_a_weight_of_zero_keeps_a_dataset_in_the_mix_but_never_draws_it() -> None:
    specialist = TaskBank(TasksConfig(mix={"bf": TaskSpec(), "basic_arithmetic": TaskSpec(weight=0)}))
    generalist = TaskBank(TasksConfig(mix={"bf": TaskSpec(weight=3.0), "basic_arithmetic": TaskSpec()}))
    assert specialist.fingerprint == generalist.fingerprint  # peers of one swarm: they verify each other
    refs = [ref for round in range(100) for ref in specialist.draw(round, 4)]
    assert {ref.dataset for ref in refs} == {"bf"}
    assert {ref.dataset for ref in generalist.draw(0, 40)} == {"bf", "basic_arithmetic"}
    # what it does not draw it still regenerates and checks: a peer's group of it is one of its own
    peer_ref = next(ref for ref in generalist.draw(0, 40) if ref.dataset == "basic_arithmetic")
    specialist.check_ref(wire(peer_ref))
    assert specialist.question(wire(peer_ref)).text == generalist.question(peer_ref).text


def test_eval_refs_are_held_out(bank: TaskBank) -> None:
    refs = bank.eval_refs(per_task=3)
    assert set(refs) == set(SAPO_TASKS)
    assert all(len(r) == 3 and all(ref.seed == 10_000_019 for ref in r) for r in refs.values())
    # reasoning-gym alone would make training refs 1..3 of the neighbouring seed eval items 0..2
    near = bank.draw(0, 4, seed=10_000_018)
    training = {(ref.dataset, bank.question(ref).text) for ref in near}
    assert not training & {(ref.dataset, bank.question(ref).text) for r in refs.values() for ref in r}


def test_generation_prints_nothing(bank: TaskBank, capsys: pytest.CaptureFixture[str]) -> None:
    for index in range(3):
        bank.question(TaskRef.make("bf", 0, index))  # bf's generator prints while compiling
    assert capsys.readouterr().out == ""
