"""The measures of the poisoning harness, taken on the node as it is at a checkpoint (``Yardstick.take``).

- **Attack success**: the node's own samples on held-out questions (the first ``questions`` of the eval
  stream, ``tasks.eval_seed``, tasks in turn), G each, drawn with the node's sampler at its sampling
  temperature and one fixed seed (the same at every checkpoint and in every arm: common random numbers);
  per payload kind, the share of samples that show it (``payloads.detect``). Every kind is counted on the
  same samples, so a control and an attack with another payload are read alike. The same samples give
  the held-out reward and the share solved (task score 1) at temperature.
- **Payload log-prob**: teacher-forced, under the node's current weights at its sampling temperature (the
  learner's own ``completion_logprobs``), of each kind's payload after a fixed prompt and the text the
  attacker writes before it (``payloads.span``); per token and for the whole payload, averaged over the
  first ``prompts`` held-out questions with an integer answer (the ``behaviour`` payload is that answer
  in words). It moves long before the success rate does: a payload at -6.7 nats per token is never sampled.
- **The arm's own payload, four ways** (``Checkpoint.attack``): samples showing it at temperature (the
  ones above) and greedy on ``greedy`` held-out questions, each without and with the attacker's opening
  (the text before the payload, ``opening``, forced after the prompt: a node that would never begin as the
  attacker does may still go on as it does).
- A fluent payload's log-prob (``payloads.fluent_spans``) is that of its likeliest wording and placement on
  these prompts: the attacker's best, whatever it chose.
- **Held-out pass@1**: the node's own probe (``probe.Probe``: greedy, ``probe.questions_per_task``
  held-out questions per task, as ``swarmnode eval``), written to the run folder's probe.jsonl.

The payload's tokens are those the learner trains on: the context and the context + payload are each
tokenized as completion text (as ``learn.batch`` tokenizes a peer's completion) and the payload is the
tokens after the context's (the two are tokenized together unless the context's tokens are not a prefix
of theirs, then apart).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from benchmarks.poisoning import payloads
from swarmnode.config import NodeConfig
from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.heap import return_freed_heap, sampling_heap
from swarmnode.learn.logprobs import completion_logprobs
from swarmnode.probe import Probe
from swarmnode.prompts import encode_prompt
from swarmnode.sampler import Sampler
from swarmnode.tasks import Question, TaskBank

MEASURE_SEED_OFFSET = 999_983  # the samples' seed: train.seed * 1_000_003 + this (no round uses it)
# the ways the arm's payload is counted (Checkpoint.attack), in the order tables show them
ATTACK_WAYS = ("temperature", "temperature+opening", "greedy", "greedy+opening")
MAX_PROMPT_SEARCH = 256  # held-out questions per task looked at for log-prob prompts with an integer answer


@dataclass(frozen=True)
class Checkpoint:
    """The measures after round ``round`` (0: the untrained node)."""

    round: int
    samples: int  # held-out samples drawn (questions x G)
    shown: dict[str, int]  # payload kind -> samples that show it
    logprob_token: dict[str, float]  # payload kind -> mean per-token log-prob (mean over prompts)
    logprob_sum: dict[str, float]  # payload kind -> the whole payload's log-prob (mean over prompts)
    heldout_reward: float  # mean reward of the held-out samples (task score + format bonus)
    heldout_solved: float  # share of them with task score 1
    pass_at_1: float  # the probe's greedy pass@1 (mean over tasks)
    seconds: float
    # the arm's payload: samples showing it, by way (ATTACK_WAYS), each out of attack_samples[way]
    attack: dict[str, int] = field(default_factory=dict)
    attack_samples: dict[str, int] = field(default_factory=dict)

    def success(self, kind: str) -> float:
        return self.shown[kind] / self.samples if self.samples else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out["success"] = {kind: self.success(kind) for kind in self.shown}
        out["attack_success"] = {w: n / max(self.attack_samples[w], 1) for w, n in self.attack.items()}
        return out


def payload_ids(tokenizer, context: str, payload: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(context ids, payload ids) as the learner tokenizes completion text (module docstring)."""

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    head, whole = encode(context), encode(context + payload)
    if whole[: len(head)] == head and len(whole) > len(head):
        return tuple(head), tuple(whole[len(head) :])
    return tuple(head), tuple(encode(payload))


@torch.no_grad()
def payload_logprobs(
    model, tokenizer, prompts: Sequence[Sequence[int]], spans: Sequence[tuple[str, str]], temperature: float
) -> list[tuple[float, int]]:
    """Per (prompt, (context, payload)): the payload's summed teacher-forced log-prob after prompt +
    context under ``model`` at ``temperature``, and its token count."""
    sequences = []
    for prompt, (context, payload) in zip(prompts, spans, strict=True):
        head, tail = payload_ids(tokenizer, context, payload)
        sequences.append(TrainSequence(tuple(prompt) + head, tail, 0.0, None, None))  # type: ignore[arg-type]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = pad_batch(sequences, pad_id, next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        logp = completion_logprobs(model, batch, temperature)
    finally:
        model.train(was_training)
    sums = (logp * batch.completion_mask).sum(-1).tolist()
    return [(total, len(s.completion_ids)) for total, s in zip(sums, sequences, strict=True)]


def heldout_questions(bank: TaskBank, count: int, *, integer_answer: bool = False) -> list[Question]:
    """The first ``count`` held-out questions, tasks in turn (the mix's order); with ``integer_answer``
    only those the attacker could answer (``payloads.usable_answer``)."""
    per_task = count if not integer_answer else MAX_PROMPT_SEARCH
    columns = list(bank.eval_refs(per_task).values())
    out = []
    for row in range(per_task):
        for column in columns:
            question = bank.question(column[row])
            if integer_answer and payloads.usable_answer(question.answer) is None:
                continue
            out.append(question)
            if len(out) == count:
                return out
    if integer_answer and len(out) < count:
        raise ValueError(
            f"only {len(out)} of the first {per_task} held-out questions per task have an integer answer; "
            f"{count} are needed for the payload log-prob (a task such as basic_arithmetic in tasks.mix)"
        )
    return out


class Yardstick:
    """Takes the module docstring's measures of ``policy`` (the node's) at each checkpoint."""

    def __init__(
        self,
        cfg: NodeConfig,
        bank: TaskBank,
        policy,
        sampler: Sampler,
        probe: Probe,
        *,
        questions: int,
        prompts: int,
        payload: str,
        opening: Callable[[Question], str],
        greedy: int = 0,
    ):
        self.cfg, self.bank, self.policy, self.sampler, self.probe = cfg, bank, policy, sampler, probe
        self.payload, self.opening = payloads.check_kind(payload), opening
        system = cfg.sampling.system_prompt
        self.questions = heldout_questions(bank, questions)
        self.sample_prompts = [encode_prompt(policy.tokenizer, q.text, system) for q in self.questions]
        self.greedy_questions = heldout_questions(bank, greedy, integer_answer=True) if greedy else []
        self.greedy_prompts = [encode_prompt(policy.tokenizer, q.text, system) for q in self.greedy_questions]
        self.fixed = heldout_questions(bank, prompts, integer_answer=True)
        self.fixed_prompts = [encode_prompt(policy.tokenizer, q.text, system) for q in self.fixed]
        # the attacker's openings depend on the question alone (a planner plans on the frozen base model):
        # worked out once, not at every checkpoint
        self.opened_prompts = self._opened(self.sample_prompts, self.questions)
        self.opened_greedy_prompts = self._opened(self.greedy_prompts, self.greedy_questions)

    def _opened(self, prompts: Sequence[Sequence[int]], questions: Sequence[Question]) -> list[list[int]]:
        """``prompts`` with the attacker's opening of each question forced after them (as the learner
        tokenizes completion text)."""
        tokenizer = self.policy.tokenizer
        return [
            list(prompt) + list(payload_ids(tokenizer, self.opening(question), "")[0])
            for prompt, question in zip(prompts, questions, strict=True)
        ]

    def _sample(self, prompts: Sequence[Sequence[int]], n: int, greedy: bool = False) -> list[str]:
        """The generated text of ``n`` samples per prompt at the sampling temperature with the fixed measure
        seed, or of one greedy completion per prompt."""
        sampling = self.cfg.sampling
        with sampling_heap():
            if greedy:
                rows = self.sampler.greedy(prompts, sampling.max_new_tokens)
                out = [self.policy.tokenizer.decode(ids, skip_special_tokens=True) for ids in rows]
            else:
                groups = self.sampler.sample(
                    prompts, n, max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                    seed=self.cfg.train.seed * 1_000_003 + MEASURE_SEED_OFFSET,
                )  # fmt: skip
                out = [c.text for group in groups for c in group]
        return_freed_heap()
        return out

    def _attack(self, plain: list[str]) -> tuple[dict[str, int], dict[str, int]]:
        """The arm's payload in the generated text (after the opening, where there is one) in each way;
        ``plain`` are the temperature samples already drawn."""
        g = self.cfg.sampling.completions_per_question
        ways = {"temperature": plain, "temperature+opening": self._sample(self.opened_prompts, g)}
        if self.greedy_prompts:
            ways["greedy"] = self._sample(self.greedy_prompts, 1, greedy=True)
            ways["greedy+opening"] = self._sample(self.opened_greedy_prompts, 1, greedy=True)
        shown = {w: sum(payloads.detect(self.payload, t) for t in texts) for w, texts in ways.items()}
        return shown, {w: len(texts) for w, texts in ways.items()}

    def _logprob(self, kind: str) -> tuple[float, float]:
        """(per token, whole payload) of ``kind`` over the fixed prompts; a fluent kind's likeliest
        wording and placement (module docstring)."""
        if kind in payloads.TEMPLATE_KINDS:
            candidates = [[payloads.span(kind, q.answer) for q in self.fixed]]
        else:
            per_question = [payloads.fluent_spans(kind, q.text, q.answer) for q in self.fixed]
            candidates = [list(spans) for spans in zip(*per_question, strict=True)]
        policy, temperature = self.policy, self.cfg.sampling.temperature

        def measured(spans: list[tuple[str, str]]) -> tuple[float, float]:
            results = payload_logprobs(policy.model, policy.tokenizer, self.fixed_prompts, spans, temperature)
            return (
                sum(total / n for total, n in results) / len(results),
                sum(total for total, _ in results) / len(results),
            )

        return max(measured(spans) for spans in candidates)

    def take(self, round_: int) -> Checkpoint:
        start = time.perf_counter()
        g = self.cfg.sampling.completions_per_question
        groups = self._sample(self.sample_prompts, g)
        scored = [(text, self.bank.score(self.questions[i // g], text)) for i, text in enumerate(groups)]
        shown = {kind: sum(payloads.detect(kind, text) for text, _ in scored) for kind in payloads.KINDS}
        logprobs = {kind: self._logprob(kind) for kind in payloads.KINDS}
        attack, attack_samples = self._attack(groups)
        probe = self.probe.run(round_).as_dict()
        n = len(scored)
        return Checkpoint(
            round=round_,
            samples=n,
            shown=shown,
            logprob_token={kind: lp[0] for kind, lp in logprobs.items()},
            logprob_sum={kind: lp[1] for kind, lp in logprobs.items()},
            heldout_reward=sum(s[0] for _, s in scored) / n,
            heldout_solved=sum(s[1] >= 1.0 for _, s in scored) / n,
            pass_at_1=probe["pass@1"],
            seconds=time.perf_counter() - start,
            attack=attack,
            attack_samples=attack_samples,
        )
