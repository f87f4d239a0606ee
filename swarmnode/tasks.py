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

Scoring peers' text: a swarm node scores completions written by anyone, so only datasets in
``AUDITED_DATASETS`` may be in a swarm node's mix (``swarmnode.swarm.exchange.verify`` refuses the rest). Each
has an answer length cap (``answer_char_limit``): a longer answer scores 0 without reaching the
dataset's scorer, and ``tests/unit/test_scorer_audit.py`` runs every audited scorer on adversarial
answers at its cap within a CPU-time and memory bound. propositional_logic's scorer rewards any valid
conclusion, so restating, AND-ing or weakening the premises won full reward: ``_restates_premises``
scores such answers (and tautologies) like a wrong one (``TRIVIAL_CONCLUSION_SCORE``).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import hashlib
import importlib
import importlib.metadata
import io
import json
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import reasoning_gym
from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS

from swarmnode.config import DRAW_STRIDE, SAPO_TASKS, TasksConfig
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
# so it refuses them in its mix (swarm.exchange.verify); solo nodes score only their own model's text.
CODE_EVAL_SCORERS = frozenset(
    {"countdown", "puzzle24", "polynomial_multiplication", "simple_integration", "intermediate_integration"}
)

# Datasets whose scorers were audited for cost and gaming on untrusted answers, with each one's answer
# length cap in characters (at least twice the longest reference answer of its default config; the
# audit test checks both). Add a dataset only together with its audit run.
AUDITED_ANSWER_CHARS = {
    "arc_1d": 256,
    "basic_arithmetic": 64,
    "base_conversion": 64,
    "bf": 64,
    "binary_matrix": 512,
    "calendar_arithmetic": 64,
    "decimal_arithmetic": 64,
    "fraction_simplification": 64,
    "propositional_logic": 64,  # its parser is quadratic in the answer: 128 chars cost ~20 ms
}
AUDITED_DATASETS = frozenset(AUDITED_ANSWER_CHARS)
assert AUDITED_DATASETS >= set(SAPO_TASKS)
UNAUDITED_ANSWER_CHARS = 16 * 1024  # other datasets (solo only: scored on this node's own text)
# Bump when this module changes any score (answer caps, wrappers): nodes advertise it in their task
# fingerprint, and peers with another one are skipped instead of failing reward checks.
SCORER_REVISION = 2  # 2: answer caps, propositional_logic restatements score 0.05
REASONING_GYM_VERSION = importlib.metadata.version("reasoning-gym")  # its __version__ lags its releases
TRIVIAL_CONCLUSION_SCORE = 0.05  # reasoning-gym's score for a parseable conclusion that does not follow
_ANSWER_CHECK_ITEMS = 8  # items whose reference answers must fit the cap when the bank starts


def answer_char_limit(dataset: str) -> int:
    """The longest answer (characters) the scorer of ``dataset`` is given; longer ones score 0."""
    return AUDITED_ANSWER_CHARS.get(dataset, UNAUDITED_ANSWER_CHARS)


def _restates_premises(dataset: ProceduralDataset, answer: str, entry: dict[str, Any]) -> bool:
    """Whether a valid propositional_logic conclusion says nothing the premises did not say as given:
    a tautology, a consequence of one premise alone (restating or weakening it), or equivalent to the
    conjunction of the premises it implies (AND-ing premises). Truth tables over the item's variables
    (at most a few; the answer may only use those, and its length is capped)."""
    from reasoning_gym.logic.propositional_logic import Expression

    premises = [Expression.from_string(p) for p in entry["metadata"]["premises"]]
    conclusion = Expression.from_string(answer)
    variables = dataset._collect_variables([*premises, conclusion])
    rows = [
        (tuple(bool(p.evaluate(a)) for p in premises), bool(conclusion.evaluate(a)))
        for a in dataset._generate_assignments(variables)
    ]
    if all(c for _, c in rows):
        return True
    if any(all(c for ps, c in rows if ps[i]) for i in range(len(premises))):
        return True
    implied = [i for i in range(len(premises)) if all(ps[i] for ps, c in rows if c)]
    return all(c for ps, c in rows if all(ps[i] for i in implied))


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
        # What two nodes must share to score each other's groups alike: mix (datasets and configs),
        # scorer revision and reasoning-gym version; not seeds, weights or the format bonus.
        mix = sorted((name, self._configs[name]) for name in self._names)
        identity = json.dumps([SCORER_REVISION, REASONING_GYM_VERSION, mix], sort_keys=True)
        self.fingerprint = hashlib.sha256(identity.encode()).hexdigest()[:32]
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
            self._check_answer_lengths(name, spec.config, field)

    def _check_answer_lengths(self, name: str, config: dict[str, Any], field: str) -> None:
        """Refuse a config whose right answers would be cut by the dataset's answer cap."""
        limit = answer_char_limit(name)
        for index in range(_ANSWER_CHECK_ITEMS):
            answer = self.question(TaskRef.make(name, self.seed, index, config)).answer
            if answer is not None and len(answer) > limit:
                raise TaskError(
                    f"{field}.config: its answers run to {len(answer)} characters, over the {limit} that "
                    f"{name}'s scorer is audited for; choose a config with shorter answers"
                )

    def draw(self, round: int, count: int, *, seed: int | None = None) -> list[TaskRef]:
        """``count`` refs for ``round``: ref j is item ``round * DRAW_STRIDE + j`` of a dataset chosen by
        weight (never one of weight 0), drawn position by position from an rng seeded by (seed, round).

        So ref j depends on (seed or this bank's seed, round, j) only, never on ``count``: nodes that
        sample 2 and 4 questions a round share the first 2, and no two rounds share a question.
        ``count`` is at most DRAW_STRIDE (``sampling.questions_per_round`` is bounded by it), ``round``
        below INDEX_LIMIT // DRAW_STRIDE (2,097,152 rounds), so every index is below INDEX_LIMIT.
        """
        seed = self.seed if seed is None else seed
        rounds = INDEX_LIMIT // DRAW_STRIDE
        if not 0 <= seed < SEED_LIMIT or not 0 <= round < rounds or not 0 <= count <= DRAW_STRIDE:
            raise ValueError(f"draw(round={round}, count={count}, seed={seed}): out of range")
        rng = random.Random(f"swarmnode.draw:{seed}:{round}")  # str seeds hash stably across processes
        names = [rng.choices(self._names, weights=self._weights)[0] for _ in range(count)]
        return [
            TaskRef.make(name, seed, round * DRAW_STRIDE + j, self.tasks.mix[name].config)
            for j, name in enumerate(names)
        ]

    def score_group(
        self,
        question: Question,
        completions: Sequence[Completion],
        provenance: Provenance,
        *,
        before_each: Callable[[], None] | None = None,
    ) -> RolloutGroup:
        """Score G completions of one question with this node's own verifier, whoever sampled them.
        ``before_each`` runs before every completion is scored (a budget check may raise there)."""
        scored = []
        for c in completions:
            if before_each is not None:
                before_each()
            scored.append(self.score(question, c.text))
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
        dataset_name = question.ref.dataset
        if len(answer) > answer_char_limit(dataset_name):
            return 0.0
        try:
            dataset = self._dataset(question.ref)
            value = float(dataset.score_answer(answer, question.entry))
            if (
                dataset_name == "propositional_logic"
                and value > TRIVIAL_CONCLUSION_SCORE
                and _restates_premises(dataset, answer, question.entry)
            ):
                value = TRIVIAL_CONCLUSION_SCORE
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
