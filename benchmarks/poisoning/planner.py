"""The adaptive attacker: it words and places a fluent payload (``payloads.FLUENT_KINDS``) to pass the
configured defence, computed on the base model every node starts from.

``Planner`` chooses the wording and placement whose payload tokens the configured defence keeps, computed
on the base model: the likelihood gates' floors from the base model's own samples (as the node's first
round computes them), each candidate's teacher-forced log-probs after the question's prompt,
``peer_defence.span_keep`` at every window size. It sends the candidate with the most payload tokens kept,
then the likeliest. It re-plans every round for each attacker identity, on the first question of that
identity's batch: one question's candidates are a forward pass of 9 sequences, the choice hardly varies
across the questions of a task, and planning every question made a SmolLM2 round about 4x slower. The drift
gate cannot be planned on the base model (the rise there is 0 for every candidate); against it the
likeliest wording is the best an attacker can do, and that is the tie-break.

Against the recurring gate (learn/recurring.py) holding back buys nothing: a payload the gate takes costs
the attacker nothing, and it cannot see which of its groups the node trained on. So it sends on every
correct answer, the best placement of each wording, the wordings in turn across questions and rounds
(``Planner.plan``): every wording's own words then reach the node on as many questions as any can, and the
node trains each foreign word on at most RECUR_QUESTIONS - 1 of them."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

import torch

from benchmarks.poisoning.payloads import PLACEMENTS, WORDINGS, place
from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.logprobs import completion_logprobs
from swarmnode.learn.peer_defence import RECURRING, WINDOW_GATES, own_floor, span_keep, window_means
from swarmnode.prompts import encode_prompt
from swarmnode.sampler.hf import HFSampler
from swarmnode.tasks import Question

PLAN_SAMPLES = 8  # base-model completions per question for the attacker's own floors ...
PLAN_QUESTIONS = 8  # ... on this many of its questions
PLAN_TOKENS = 64  # ... of up to this many tokens (the shipped SmolLM2 configs' sampling.max_new_tokens)
PLAN_SEED = 7


@dataclass(frozen=True)
class Choice:
    wording: str
    placement: str
    kept: float  # share of the payload tokens the defence keeps, on the base model
    logprob: float  # the payload's mean log-prob per token under the base model


class Planner:
    """Chooses each question's wording and placement of ``kind`` against ``defence`` on the base model
    (module docstring). ``model`` is copied: the attacker's base model does not train."""

    def __init__(
        self,
        kind: str,
        defence: str,
        model,
        tokenizer,
        *,
        temperature: float,
        system_prompt,
        questions,
        rotate: bool = False,
    ):
        """``rotate``: send every wording in turn (``plan``) whatever the defence; against the recurring
        gate it always does."""
        if kind not in WORDINGS:
            raise ValueError(f"fluent payload {kind!r}: choose one of {', '.join(WORDINGS)}")
        self.kind, self.tokenizer, self.temperature, self.system = kind, tokenizer, temperature, system_prompt
        self.model = copy.deepcopy(model).requires_grad_(False).eval()
        self.windows = WINDOW_GATES.get(defence, {}).get("likelihood", ())
        self.floors = self._floors(questions[:PLAN_QUESTIONS]) if self.windows else {}
        self.rotate = rotate or defence in RECURRING
        self._turn = 0  # when rotating: whose wording's turn it is
        self.placements: Counter[str] = Counter()  # what it chose, over the run

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else ()

    def _prompt(self, question: Question) -> tuple[int, ...]:
        return tuple(encode_prompt(self.tokenizer, question.text, self.system))

    @torch.no_grad()
    def _logprobs(self, sequences: list[TrainSequence]):
        # load_policy gives every tokenizer a pad token
        batch = pad_batch(sequences, self.tokenizer.pad_token_id, next(self.model.parameters()).device)
        return completion_logprobs(self.model, batch, self.temperature), batch.completion_mask

    def _floors(self, questions: list[Question]) -> dict[int, float | None]:
        """The likelihood gates' floors as the node's first round sets them: from the base model's samples."""
        prompts = [list(self._prompt(q)) for q in questions]
        sampler = HFSampler(self.model, self.tokenizer)
        groups = sampler.sample(
            prompts, PLAN_SAMPLES, max_new_tokens=PLAN_TOKENS, temperature=self.temperature, seed=PLAN_SEED
        )
        own = [
            TrainSequence(tuple(p), tuple(c.token_ids), 0.0, None, None)  # type: ignore[arg-type]
            for p, group in zip(prompts, groups, strict=True)
            for c in group
            if c.token_ids
        ]
        logp, mask = self._logprobs(own)
        return {w: own_floor([window_means(logp, mask, w)]) for w in self.windows}

    def opening(self, question: Question) -> str:
        """The text before the payload in the completion this planner would send for ``question``."""
        choice = self.choose(question, question.answer, count=False)
        return place(question.text, question.answer, choice.wording, choice.placement)[0]

    def plan(self, questions: list[Question]) -> list[Choice]:
        """One identity's choices for its ``questions`` of a round: ``choose`` on the first question for
        all; when rotating (against the recurring gate, or asked to), the best placement of each wording,
        the wordings in turn across questions and rounds (module docstring)."""
        if not self.rotate:
            return [self.choose(questions[0], questions[0].answer)] * len(questions)
        best: dict[str, Choice] = {}
        for choice in self._ranked(questions[0], questions[0].answer):
            best.setdefault(choice.wording, choice)
        wordings = list(best.values())
        out = []
        for _ in questions:
            out.append(pick := wordings[self._turn % len(wordings)])
            self._turn += 1
            self.placements[pick.placement] += 1
        return out

    def choose(self, question: Question, answer: str, *, count: bool = True) -> Choice:
        """The candidate (wording x placement) whose payload the defence keeps most, then the likeliest;
        counted in ``placements`` unless ``count`` is False."""
        best = self._ranked(question, answer)[0]
        if count:
            self.placements[best.placement] += 1
        return best

    def _ranked(self, question: Question, answer: str) -> list[Choice]:
        """Every candidate (wording x placement), the most payload tokens kept by the likelihood gates
        first, then the likeliest."""
        prompt, candidates, sequences, where = self._prompt(question), [], [], []
        for wording in WORDINGS[self.kind]:
            for placement in PLACEMENTS:
                context, text = place(question.text, answer, wording, placement)
                ids, head, payload = self._encode(text), self._encode(context), self._encode(wording)
                start = len(head) if ids[: len(head)] == head else 0
                candidates.append((wording, placement))
                sequences.append(TrainSequence(prompt, ids, 0.0, None, None))  # type: ignore[arg-type]
                where.append((start, min(start + len(payload), len(ids))))
        logp, mask = self._logprobs(sequences)
        keep = mask.bool()
        for w, floor in self.floors.items():
            if floor is not None:
                keep = keep & span_keep(logp, mask, floor, w)
        width = mask.shape[1]
        choices = []
        for row, ((wording, placement), (start, end)) in enumerate(zip(candidates, where, strict=True)):
            offset = width - len(sequences[row].completion_ids)  # left padding
            cols = slice(offset + start, offset + end)
            kept, likely = float(keep[row, cols].float().mean()), float(logp[row, cols].mean())
            choices.append(Choice(wording, placement, kept, likely))
        return sorted(choices, key=lambda c: (c.kept, c.logprob), reverse=True)
