"""Generate the task vectors in protocol/vectors/tasks/: task reference -> question, answer and the task
scores of given completions, as a receiver computes them (PROTOCOL.md section 5a).

    python -m protocol.make_task_vectors          # (re)write the files
    python -m protocol.make_task_vectors --check  # exit 1 if the committed files differ

A second implementation checks itself against them: regenerate each question from (dataset, config,
seed, index), extract each completion's answer, score it, and compare. The files name the
reasoning-gym version and the scorer revision they were made with (``swarmnode.tasks``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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


def vector(bank: TaskBank, name: str) -> dict[str, Any]:
    config = EXTRA.get(name, {})
    ref = TaskRef.make(name, SEED, INDEX, config)
    question = bank.question(ref)
    completions = []
    conclusion = _logic_conclusion(bank, question) if question.answer is None else None
    for text in _completions(name, question.answer, question.entry["metadata"], conclusion):
        answer, format_ok = extract_answer(text)
        completions.append(
            {
                "text": text,
                "answer": answer,
                "format_ok": format_ok,
                "task_score": bank.score(question, text)[1],
            }
        )
    return {
        "name": name,
        "reasoning_gym_version": REASONING_GYM_VERSION,
        "scorer_revision": SCORER_REVISION,
        "task": {"dataset": name, "config": config, "seed": SEED, "index": INDEX},
        "item": {
            "dataset_seed": SEED * INDEX_LIMIT + INDEX // 4096 * 4096,
            "dataset_size": 4096,
            "position": INDEX % 4096,
        },
        "question": question.text,
        "answer": question.answer,
        "metadata": json.loads(json.dumps(question.entry["metadata"], default=str)),
        "answer_char_limit": answer_char_limit(name),
        "completions": completions,
    }


def build() -> dict[str, str]:
    mix = {name: TaskSpec(config=EXTRA.get(name, {})) for name in SAPO_TASKS}
    bank = TaskBank(TasksConfig(mix=mix, seed=SEED))
    return {
        f"{name}.json": json.dumps(vector(bank, name), indent=1, ensure_ascii=False, sort_keys=True) + "\n"
        for name in SAPO_TASKS
    }


def main() -> int:
    files = build()
    if "--check" in sys.argv:
        stale = [
            n
            for n, text in files.items()
            if not (VECTOR_DIR / n).exists() or (VECTOR_DIR / n).read_text() != text
        ]
        print("stale: " + ", ".join(stale) if stale else "task vectors up to date")
        return 1 if stale else 0
    VECTOR_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (VECTOR_DIR / name).write_text(text)
    print(f"wrote {len(files)} task vectors to {VECTOR_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
