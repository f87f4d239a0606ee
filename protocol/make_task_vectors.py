"""Generate the task vectors in protocol/vectors/tasks/: task reference -> question, answer and the task
scores of given completions, as a receiver computes them (PROTOCOL.md section 5a).

    python -m protocol.make_task_vectors          # (re)write the files
    python -m protocol.make_task_vectors --check  # exit 1 if the committed files differ

A second implementation checks itself against them: regenerate each question from (dataset, config,
seed, index), extract each completion's answer, score it, and compare. The files name the
reasoning-gym version and the scorer revision they were made with (``swarmnode.tasks``).
``propositional_logic_restatements.json`` walks through the propositional_logic wrapper (each answer
with reasoning-gym's own score beside the task score), and ``protocol/vectors/task_fingerprints.json``
shows the task fingerprint of two mixes, with the exact JSON text that is hashed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import reasoning_gym

from swarmnode.config import SAPO_TASKS, TasksConfig, TaskSpec
from swarmnode.rollouts import TaskRef
from swarmnode.tasks import (
    INDEX_LIMIT,
    REASONING_GYM_VERSION,
    SCORER_REVISION,
    TaskBank,
    answer_char_limit,
    extract_answer,
)

VECTOR_DIR = Path(__file__).resolve().parent / "vectors" / "tasks"
SEED = 12345
INDEX = 4097  # the second chunk of 4096 items: the item seed is SEED * 2**31 + 4096, item 1 in it
EXTRA = {  # non-default configs, to show how a config enters the item
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
}
FINGERPRINT_FILE = VECTOR_DIR.parent / "task_fingerprints.json"
# propositional_logic's wrapper (PROTOCOL.md section 5a) on one item: premises (R → S), R and
# ((S ∧ P) → (P ∧ P)); S follows from the first two together. Each answer with what it shows.
RESTATEMENTS = "propositional_logic_restatements"
RESTATEMENTS_INDEX = 4100  # the same chunk as INDEX: item 4 of the dataset seeded SEED * 2**31 + 4096
RESTATEMENT_ANSWERS = (
    ("S", "follows from two premises together; a bare variable, so reasoning-gym gives 0.25: kept"),
    ("¬¬S", "the same conclusion with an operator: not trivial for reasoning-gym, 1.0, kept"),
    ("(S ∨ Q)", "follows, restates nothing: 1.0, kept"),
    ("(Q ∨ ¬Q)", "a tautology: reasoning-gym 0.25, the wrapper 0.05"),
    ("R", "restates a premise (a bare variable): reasoning-gym 0.25, the wrapper 0.05"),
    ("(R ∨ Q)", "follows from one premise alone (weakens R): reasoning-gym 1.0, the wrapper 0.05"),
    ("(R ∧ S)", "equivalent to the conjunction of the premises it implies: 1.0, the wrapper 0.05"),
    ("(P ∧ S)", "does not follow: reasoning-gym 0.05, the wrapper never applies below 0.25"),
    ("(T ∨ S)", "T is not one of the item's variables: reasoning-gym 0"),
)


def _logic_conclusion(bank: TaskBank, question) -> str:
    """propositional_logic: the first literal or two-literal formula that scores 1.0 (it follows from the
    premises and restates none of them)."""
    variables = question.entry["metadata"]["variables"]
    literals = [*variables, *(f"¬{v}" for v in variables)]
    ops = ("∧", "∨", "→", "↔")
    for answer in [*literals, *(f"({a} {op} {b})" for a in literals for b in literals for op in ops)]:
        if bank.score(question, f"<answer>{answer}</answer>")[1] == 1.0:
            return answer
    raise ValueError("no conclusion found: choose another SEED or INDEX")


def _completions(name: str, answer: str | None, metadata: dict, conclusion: str | None) -> list[str]:
    right = answer if answer is not None else conclusion
    extra = []
    if answer is None:  # propositional_logic: restating a premise earns only the "does not follow" score
        extra = [f"<answer>{metadata['premises'][0]}</answer>"]
    return extra + [
        f"Let me think.\n<answer>{right}</answer>",  # tagged: format_ok
        f"The answer is {right}.",  # untagged: falls back to the text after "answer is"
        "<answer>" + "9" * (answer_char_limit(name) + 1) + "</answer>",  # over the cap: 0, never scored
        "I do not know",  # last line taken as the answer
        "",
    ]


def _completion(bank: TaskBank, question, text: str) -> dict[str, Any]:
    answer, format_ok = extract_answer(text)
    return {
        "text": text,
        "answer": answer,
        "format_ok": format_ok,
        "task_score": bank.score(question, text)[1],
    }


def vector(bank: TaskBank, name: str) -> dict[str, Any]:
    config = EXTRA.get(name, {})
    question = bank.question(TaskRef.make(name, SEED, INDEX, config))
    conclusion = _logic_conclusion(bank, question) if question.answer is None else None
    texts = _completions(name, question.answer, question.entry["metadata"], conclusion)
    return _vector(name, question, INDEX, [_completion(bank, question, text) for text in texts])


def restatements_vector(bank: TaskBank) -> dict[str, Any]:
    """propositional_logic's wrapper: each answer's ``dataset_score`` (reasoning-gym's own
    ``score_answer``) beside its ``task_score`` (after the wrapper), and ``why``."""
    name = "propositional_logic"
    question = bank.question(TaskRef.make(name, SEED, RESTATEMENTS_INDEX, EXTRA.get(name, {})))
    dataset = reasoning_gym.create_dataset(name, seed=SEED * INDEX_LIMIT + RESTATEMENTS_INDEX // 4096 * 4096)
    completions = []
    for answer, why in RESTATEMENT_ANSWERS:
        completion = _completion(bank, question, f"<answer>{answer}</answer>")
        completion.update(dataset_score=float(dataset.score_answer(answer, question.entry)), why=why)
        completions.append(completion)
    return {**_vector(name, question, RESTATEMENTS_INDEX, completions), "name": RESTATEMENTS}


def _vector(name: str, question, index: int, completions: list[dict[str, Any]]) -> dict[str, Any]:
    config = EXTRA.get(name, {})
    return {
        "name": name,
        "reasoning_gym_version": REASONING_GYM_VERSION,
        "scorer_revision": SCORER_REVISION,
        "task": {"dataset": name, "config": config, "seed": SEED, "index": index},
        "item": {
            "dataset_seed": SEED * INDEX_LIMIT + index // 4096 * 4096,
            "dataset_size": 4096,
            "position": index % 4096,
        },
        "question": question.text,
        "answer": question.answer,
        "metadata": json.loads(json.dumps(question.entry["metadata"], default=str)),
        "answer_char_limit": answer_char_limit(name),
        "completions": completions,
    }


def _dump(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def build() -> dict[str, str]:
    """The files of ``VECTOR_DIR``: one per audited dataset, and the propositional_logic wrapper's."""
    mix = {name: TaskSpec(config=EXTRA.get(name, {})) for name in SAPO_TASKS}
    bank = TaskBank(TasksConfig(mix=mix, seed=SEED))
    files = {f"{name}.json": _dump(vector(bank, name)) for name in SAPO_TASKS}
    files[f"{RESTATEMENTS}.json"] = _dump(restatements_vector(bank))
    return files


def fingerprint_identity(mix: dict[str, dict[str, Any]]) -> str:
    """The text PROTOCOL.md section 5a hashes into a task fingerprint, built as stated there: each config
    as canonical JSON text (sorted keys, no spaces, non-ASCII as is), inside a JSON array written with
    Python ``json.dumps`` defaults (", " and ": ", non-ASCII as \\uXXXX)."""
    configs = sorted(
        [name, json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)]
        for name, config in mix.items()
    )
    return json.dumps([SCORER_REVISION, REASONING_GYM_VERSION, configs], sort_keys=True)


def build_fingerprints() -> str:
    """``FINGERPRINT_FILE``: the default mix (every dataset listed without a config: config {}) and the
    task vectors' mix (one config given); each fingerprint is what ``TaskBank`` advertises."""
    mixes = {
        "default_mix": {name: spec.config for name, spec in TasksConfig().mix.items()},
        "task_vectors_mix": {name: EXTRA.get(name, {}) for name in SAPO_TASKS},
    }
    entries = []
    for name, mix in mixes.items():
        bank = TaskBank(TasksConfig(mix={n: TaskSpec(config=c) for n, c in mix.items()}, seed=SEED))
        identity = fingerprint_identity(mix)
        if hashlib.sha256(identity.encode()).hexdigest()[:32] != bank.fingerprint:
            raise AssertionError(f"{name}: the stated rule no longer gives TaskBank's fingerprint")
        entries.append({"name": name, "mix": mix, "identity": identity, "task_fingerprint": bank.fingerprint})
    return _dump(
        {
            "description": "task_fingerprint = the first 32 hex characters of sha256(UTF-8 of identity); "
            "a dataset listed without a config has config {}",
            "reasoning_gym_version": REASONING_GYM_VERSION,
            "scorer_revision": SCORER_REVISION,
            "mixes": entries,
        }
    )


def main() -> int:
    files = {VECTOR_DIR / name: text for name, text in build().items()}
    files[FINGERPRINT_FILE] = build_fingerprints()
    if "--check" in sys.argv:
        stale = [p.name for p, text in files.items() if not p.exists() or p.read_text() != text]
        print("stale: " + ", ".join(stale) if stale else "task vectors up to date")
        return 1 if stale else 0
    VECTOR_DIR.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
    print(f"wrote {len(files)} task vectors to {VECTOR_DIR.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
