"""Right answers for test questions, found the way a careful solver would (shared by the task, verifier
and swarm tests)."""

from __future__ import annotations

from itertools import product

from swarmnode.tasks import Question, TaskBank

_OPS = ("∧", "∨", "→", "↔")


def oracle(question: Question, bank: TaskBank) -> str | None:
    """A genuinely correct answer, or None when the question has none this node rewards fully.

    propositional_logic has answer=None and rewards a conclusion that follows from the premises without
    restating them (``tasks.py``): the first literal or two-literal formula that scores 1.0. Some items
    have none (all premises the same statement): every consequence restates one premise.
    """
    if question.answer is not None:
        return question.answer
    variables = question.entry["metadata"]["variables"]
    literals = [*variables, *(f"¬{v}" for v in variables)]
    candidates = [*literals, *(f"({a} {op} {b})" for a, b in product(literals, repeat=2) for op in _OPS)]
    for answer in candidates:
        if bank.score(question, f"<answer>{answer}</answer>")[1] == 1.0:
            return answer
    return None
