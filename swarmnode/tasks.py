"""Questions and their verifiable rewards, from reasoning-gym.

A question is named by a ``TaskRef`` and regenerated from it, so no node ever trusts question text or
ground truth sent by a peer. Rewards always come from the dataset's own ``score_answer``; this module
only extracts the answer from a completion and adds the format bonus.

How a ref maps to a reasoning-gym item: the nine SAPO datasets generate item ``idx`` with
``Random(dataset_seed + idx)``, so plain ``(seed, idx)`` pairs overlap across seeds ((s, i) is the same
item as (s + 1, i - 1)). A ref's item is built from a dataset seeded ``seed * 2**31 + chunk start``
instead, i.e. ``Random(seed * 2**31 + index)``: distinct for every (seed, index) with
0 <= index < 2**31, so node streams and the held-out eval stream never share a question. Datasets are
built per chunk of ``_CHUNK`` indices because some reasoning-gym datasets (e.g. list_functions,
gsm_symbolic) precompute ``size`` entries at construction: a huge ``size`` would exhaust memory.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib
import io
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import reasoning_gym
from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS

from swarmnode.config import TasksConfig
from swarmnode.errors import TaskError
from swarmnode.rollouts import Completion, Provenance, RolloutGroup, TaskRef

INDEX_LIMIT = 2**31  # refs carry 0 <= index < INDEX_LIMIT
SEED_LIMIT = 2**63  # and 0 <= seed < SEED_LIMIT
_CHUNK = 4096  # items per constructed dataset: bounds datasets that precompute `size` entries
_MAX_CACHED = 512  # constructed datasets kept (peers' seeds each need their own)
_RESERVED = ("seed", "size")  # set from the ref, never from the config

# binary_matrix, spiral_matrix, string_insertion and n_queens call eval() on the answer text to accept
# answers written as Python lists. Answers come from the model and from untrusted peers' completions, so
# these modules get a literal-only eval: same scores for list answers, no code execution.
for _module in ("algorithmic.binary_matrix", "algorithmic.spiral_matrix", "algorithmic.string_insertion",
                "games.n_queens"):  # fmt: skip
    importlib.import_module(f"reasoning_gym.{_module}").eval = ast.literal_eval

# These datasets score an answer by handing its text to sympy's parse_expr, which evaluates it as Python:
# a completion can run any code on the node that scores it. A swarm node scores its peers' completions,
# so it refuses them in its mix (swarmnode.swarm.verify); solo nodes score only their own model's text.
CODE_EVAL_SCORERS = frozenset(
    {"countdown", "puzzle24", "polynomial_multiplication", "simple_integration", "intermediate_integration"}
)


_OPEN, _CLOSE = "<answer>", "</answer>"
_ANSWER_MARKER = re.compile(r"\banswer(?:\s+is\b\s*:?|\s*:)", re.IGNORECASE)


@dataclass(frozen=True)
class Question:
    """One regenerated question. ``entry`` is reasoning-gym's raw item: scoring needs its metadata
    (``answer`` is None for datasets such as propositional_logic that score from metadata)."""

    ref: TaskRef
    text: str
    answer: str | None
    entry: dict[str, Any]


def extract_answer(text: str) -> tuple[str, bool]:
    """(answer, format_ok): the content of the last ``<answer>...</answer>`` pair.

    Without a complete pair, format_ok is False and the answer falls back to the text after the last
    "answer is"/"Answer:", else the last non-empty line, so an untrained small model that ignores the
    tags still gets task signal.
    """
    end = text.rfind(_CLOSE)
    start = text.rfind(_OPEN, 0, end) if end >= 0 else -1
    if start >= 0:
        return text[start + len(_OPEN) : end].strip(), True
    markers = list(_ANSWER_MARKER.finditer(text))
    if markers:
        lines = text[markers[-1].end() :].strip().splitlines()
        answer = lines[0] if lines else ""
    else:
        lines = [line for line in text.splitlines() if line.strip()]
        answer = lines[-1] if lines else ""
    return answer.strip().rstrip(".").rstrip(), False


def _quiet() -> contextlib.AbstractContextManager[Any]:
    """bf's generator prints to stdout; keep it out of the node's output."""
    return contextlib.redirect_stdout(io.StringIO())


class TaskBank:
    """This node's task mix: draws refs, regenerates questions, verifies peers' refs, scores answers."""

    def __init__(self, tasks: TasksConfig, *, default_seed: int = 0) -> None:
        """Validate every dataset of the mix by constructing it and generating one item.

        ``default_seed`` is the question-stream seed when ``tasks.seed`` is None (a node passes one
        derived from its peer id, so peers draw different questions).
        """
        self.tasks = tasks
        self.seed = tasks.seed if tasks.seed is not None else default_seed % SEED_LIMIT
        self._names = sorted(tasks.mix)  # draw order independent of the YAML's order
        self._weights = [tasks.mix[name].weight for name in self._names]
        self._configs = {
            name: TaskRef.make(name, 0, 0, spec.config).config for name, spec in tasks.mix.items()
        }
        self._datasets: dict[tuple[str, tuple, int], ProceduralDataset] = {}
        for name, spec in tasks.mix.items():
            field = f"tasks.mix.{name}"
            if name not in DATASETS:
                close = difflib.get_close_matches(name, DATASETS, n=5, cutoff=0.5)
                known = (
                    f"close matches: {', '.join(close)}" if close else f"{len(DATASETS)} known, none close"
                )
                raise TaskError(f"{field}: unknown reasoning-gym dataset {name!r} ({known})")
            reserved = [key for key in _RESERVED if key in spec.config]
            if reserved:
                raise TaskError(
                    f"{field}.config.{reserved[0]}: set by swarmnode from tasks.seed, not configurable"
                )
            try:
                self.question(TaskRef.make(name, self.seed, 0, spec.config))
            except Exception as exc:
                reason = str(exc) or type(exc).__name__
                raise TaskError(f"{field}.config: {reason}") from exc

    def draw(self, round: int, count: int, *, seed: int | None = None) -> list[TaskRef]:
        """``count`` refs for ``round``: datasets by weight, index ``round * count + j`` (fresh each round).

        Deterministic in (seed or this bank's seed, round, count).
        """
        seed = self.seed if seed is None else seed
        if not 0 <= seed < SEED_LIMIT or round < 0 or count < 0 or (round + 1) * count > INDEX_LIMIT:
            raise ValueError(f"draw(round={round}, count={count}, seed={seed}): out of range")
        rng = random.Random(f"swarmnode.draw:{seed}:{round}")  # str seeds hash stably across processes
        names = rng.choices(self._names, weights=self._weights, k=count)
        return [
            TaskRef.make(name, seed, round * count + j, self.tasks.mix[name].config)
            for j, name in enumerate(names)
        ]

    def score_group(
        self, question: Question, completions: Sequence[Completion], provenance: Provenance
    ) -> RolloutGroup:
        """Score G completions of one question with this node's own verifier, whoever sampled them."""
        scored = [self.score(question, c.text) for c in completions]
        return RolloutGroup(
            ref=question.ref,
            question=question.text,
            completions=tuple(completions),
            rewards=tuple(s[0] for s in scored),
            task_scores=tuple(s[1] for s in scored),
            format_ok=tuple(s[2] for s in scored),
            provenance=provenance,
        )

    def eval_refs(self, per_task: int) -> dict[str, list[TaskRef]]:
        """Held-out refs: the first ``per_task`` items of every dataset under tasks.eval_seed."""
        return {
            name: [TaskRef.make(name, self.tasks.eval_seed, i, spec.config) for i in range(per_task)]
            for name, spec in self.tasks.mix.items()
        }

    def check_ref(self, ref: TaskRef) -> None:
        """Refuse a ref this node did not choose to train on (e.g. from a peer); cheap, generates nothing."""
        if not isinstance(ref.dataset, str) or ref.dataset not in self._configs:
            raise TaskError(f"ref.dataset {ref.dataset!r}: not in this node's task mix")
        if ref.config != self._configs[ref.dataset]:
            raise TaskError(f"ref.config of {ref.dataset!r}: differs from tasks.mix.{ref.dataset}.config")
        for field, value, limit in (("index", ref.index, INDEX_LIMIT), ("seed", ref.seed, SEED_LIMIT)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
                raise TaskError(f"ref.{field}: must be an int in [0, {limit}), got {value!r}")

    def question(self, ref: TaskRef) -> Question:
        """Regenerate the question named by ``ref`` (which must pass ``check_ref``)."""
        self.check_ref(ref)
        with _quiet():
            entry = self._dataset(ref)[ref.index % _CHUNK]
        return Question(ref=ref, text=entry["question"], answer=entry["answer"], entry=entry)

    def score(self, question: Question, completion_text: str) -> tuple[float, float, bool]:
        """(reward, task_score, format_ok); reward = task_score + tasks.format_reward if format_ok.

        task_score is the dataset's own score_answer, clamped to [0, 1]; an empty answer scores 0 (some
        datasets give any answer, even an empty one, a small participation score), and so does a
        score_answer that raises: it sees model output and peers' text.
        """
        answer, format_ok = extract_answer(completion_text)
        task_score = self._task_score(question, answer) if answer else 0.0
        return task_score + self.tasks.format_reward * format_ok, task_score, format_ok

    def _task_score(self, question: Question, answer: str) -> float:
        try:
            value = float(self._dataset(question.ref).score_answer(answer, question.entry))
        except Exception:
            return 0.0
        return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0

    def _dataset(self, ref: TaskRef) -> ProceduralDataset:
        """The dataset holding ref's item at ``ref.index % _CHUNK`` (see the module docstring)."""
        seed = ref.seed * INDEX_LIMIT + ref.index // _CHUNK * _CHUNK
        key = (ref.dataset, ref.config, seed)
        dataset = self._datasets.get(key)
        if dataset is None:
            if len(self._datasets) >= _MAX_CACHED:
                del self._datasets[next(iter(self._datasets))]
            with _quiet():
                dataset = reasoning_gym.create_dataset(
                    ref.dataset, **ref.config_dict(), seed=seed, size=_CHUNK
                )
            self._datasets[key] = dataset
        return dataset
