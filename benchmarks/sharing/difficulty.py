"""Step 0 of the sharing experiments: how often the untrained model solves each candidate task, to pick
E1's two tasks and
E2's mix before any learning run.

A task teaches through GRPO only where the model is sometimes right: at pass@1 near 0 every group is
all-wrong (no advantage), near 1 all-right. E1 keeps tasks solved ``BAND`` (10-40%) of the time; E2 wants
a mix at ``E2_BAND`` (10-15%: about half the groups all-wrong). Only datasets whose scorers were audited
for peers' text (``tasks.AUDITED_ANSWER_CHARS``) can be shared in a swarm, so the candidates are those,
with harder settings of the arithmetic ones.

A candidate's number is ``swarmnode eval``'s scoring (``evaluate.score_policy``: greedy, the first N
held-out questions of the task under ``tasks.eval_seed``) of the model as the node loads it, untrained;
the probe (``probe.questions_per_task``) asks the first questions of that same stream, so its round 0
is this number on fewer questions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from swarmnode.config import TasksConfig

if TYPE_CHECKING:
    from swarmnode.config import NodeConfig
    from swarmnode.policy import Policy

BAND = (0.10, 0.40)  # E1: pass@1 of the untrained model on a task worth specialising in
E2_BAND = (0.10, 0.15)  # E2: a mix hard enough that about half the groups are all-wrong


@dataclass(frozen=True)
class Candidate:
    label: str
    dataset: str
    config: dict[str, Any] = field(default_factory=dict, hash=False)


_PLUS_MINUS = {"operators": ["+", "-"]}
CANDIDATES = (  # easiest first within a dataset; the first is node_configs/arithmetic-easy.yaml's task
    Candidate("add-sub 2x1 digit", "basic_arithmetic",
              {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, **_PLUS_MINUS}),
    Candidate("add-sub 3x1 digit", "basic_arithmetic",
              {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1, **_PLUS_MINUS}),
    Candidate("add-sub 2x2 digits", "basic_arithmetic",
              {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, **_PLUS_MINUS}),
    Candidate("times 2x1 digit", "basic_arithmetic",
              {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["*"]}),
    Candidate("+-* 2-3 terms, 1-2 digits", "basic_arithmetic",
              {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2, "operators": ["+", "-", "*"],
               "allow_parentheses": False}),
    Candidate("decimals 2 terms, 1 place", "decimal_arithmetic",
              {"min_terms": 2, "max_terms": 2, "min_num_decimal_places": 1, "max_num_decimal_places": 1}),
    Candidate("decimals 2-3 terms, 1-2 places", "decimal_arithmetic",
              {"min_terms": 2, "max_terms": 3, "min_num_decimal_places": 1, "max_num_decimal_places": 2}),
    Candidate("bases 2-10, values < 100", "base_conversion",
              {"min_base": 2, "max_base": 10, "max_value": 100}),
    Candidate("bases, default", "base_conversion"),
    Candidate("fractions < 20, plain", "fraction_simplification",
              {"max_value": 20, "max_factor": 10, "styles": ["plain"]}),
    Candidate("fractions, default", "fraction_simplification"),
    Candidate("weekday offset", "calendar_arithmetic", {"tasks": ["weekday_offset"]}),
    Candidate("calendar, default", "calendar_arithmetic"),
    Candidate("logic 2 vars, 2 premises", "propositional_logic",
              {"min_vars": 2, "max_vars": 2, "min_statements": 2, "max_statements": 2, "max_complexity": 1}),
    Candidate("logic, default", "propositional_logic"),
    Candidate("arc_1d 10-12 cells", "arc_1d", {"min_size": 10, "max_size": 12}),
    Candidate("bf, default", "bf"),
    Candidate("binary matrix 3x3", "binary_matrix", {"min_n": 3, "max_n": 3}),
)  # fmt: skip


@dataclass(frozen=True)
class Difficulty:
    """The untrained model on one candidate: greedy pass@1, mean score and format rate."""

    candidate: Candidate
    questions: int
    pass1: float
    score: float
    format: float
    seconds: float

    @property
    def in_band(self) -> bool:
        return BAND[0] <= self.pass1 <= BAND[1]

    @property
    def in_e2_band(self) -> bool:
        return E2_BAND[0] <= self.pass1 <= E2_BAND[1]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "in_band": self.in_band, "in_e2_band": self.in_e2_band}


def candidate_tasks(base: TasksConfig, candidate: Candidate) -> TasksConfig:
    """``base`` (its eval seed, format bonus) with the candidate as the whole mix."""
    return TasksConfig.model_validate(
        {**base.model_dump(), "mix": {candidate.dataset: {"config": candidate.config}}}
    )


def measure(
    cfg: NodeConfig,
    candidates: list[Candidate],
    questions: int,
    *,
    policy: Policy | None = None,
    on_row: Callable[[Difficulty], None] | None = None,
) -> list[Difficulty]:
    """Each candidate's ``Difficulty`` on its first ``questions`` held-out questions, for ``policy`` (by
    default ``cfg.model`` loaded as a node loads it, untrained) at ``cfg.sampling``'s answer length and
    system prompt; ``on_row`` sees each row as it is measured."""
    from swarmnode.evaluate import score_policy
    from swarmnode.policy import load_policy
    from swarmnode.tasks import TaskBank

    policy = policy or load_policy(cfg.model, seed=cfg.train.seed)
    rows = []
    for candidate in candidates:
        bank = TaskBank(candidate_tasks(cfg.tasks, candidate))
        t0 = time.monotonic()
        scored = score_policy(
            policy,
            bank,
            bank.eval_refs(questions),
            max_new_tokens=cfg.sampling.max_new_tokens,
            system_prompt=cfg.sampling.system_prompt,
        )[candidate.dataset]
        row = Difficulty(
            candidate, questions, scored["pass@1"], scored["score"], scored["format"],
            round(time.monotonic() - t0, 1),
        )  # fmt: skip
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def table(rows: list[Difficulty]) -> str:
    """A markdown table; ``*`` marks pass@1 in ``BAND``, ``**`` in ``E2_BAND`` too."""
    lines = [
        "| candidate | dataset | pass@1 | score | format | questions | s | band |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "**" if r.in_e2_band else "*" if r.in_band else ""
        numbers = [
            f"{r.pass1:.3f}",
            f"{r.score:.3f}",
            f"{r.format:.2f}",
            str(r.questions),
            f"{r.seconds:.0f}",
        ]
        cells = [r.candidate.label, r.candidate.dataset, *numbers, mark]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        f"\n`*`: pass@1 in [{BAND[0]:.2f}, {BAND[1]:.2f}] (E1 candidates); `**`: also in "
        f"[{E2_BAND[0]:.2f}, {E2_BAND[1]:.2f}] (E2)."
    )
    return "\n".join(lines)
