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

Against the recurring gate (learn/recurring.py) it keeps to the gate's budget instead of wasting payloads
on it: per question it sends the best-ranked wording none of whose spans foreign to the node (not in the
base model's samples) would then be on RECUR_QUESTIONS questions (the node remembers them for good),
counted over all its identities, and a clean correct answer when no wording fits (``Planner.plan``)."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

import torch

from benchmarks.poisoning.payloads import PLACEMENTS, WORDINGS, place
from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.logprobs import completion_logprobs
from swarmnode.learn.peer_defence import RECURRING, WINDOW_GATES, own_floor, span_keep, window_means
from swarmnode.learn.recurring import RECUR_QUESTIONS, spans
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
        self, kind: str, defence: str, model, tokenizer, *, temperature: float, system_prompt, questions
    ):
        if kind not in WORDINGS:
            raise ValueError(f"fluent payload {kind!r}: choose one of {', '.join(WORDINGS)}")
        self.kind, self.tokenizer, self.temperature, self.system = kind, tokenizer, temperature, system_prompt
        self.model = copy.deepcopy(model).requires_grad_(False).eval()
        self.windows = WINDOW_GATES.get(defence, {}).get("likelihood", ())
        self.recurring = defence in RECURRING
        own = self._base_samples(questions[:PLAN_QUESTIONS]) if self.windows or self.recurring else []
        self.floors = self._floors(own) if self.windows else {}
        # the recurring gate: what the node writes itself (estimated from the base model's samples), and
        # on which questions this attacker (all its identities) already sent each span
        self.own_spans = {span for seq in own for _, span in spans(seq.completion_ids)}
        self.sent: dict[tuple[int, ...], set[str]] = {}
        self.placements: Counter[str] = Counter()  # what it chose, over the run
        self.held_back = 0  # questions answered without the payload: the recurring gate's budget was spent

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else ()

    def _prompt(self, question: Question) -> tuple[int, ...]:
        return tuple(encode_prompt(self.tokenizer, question.text, self.system))

    @torch.no_grad()
    def _logprobs(self, sequences: list[TrainSequence]):
        # load_policy gives every tokenizer a pad token
        batch = pad_batch(sequences, self.tokenizer.pad_token_id, next(self.model.parameters()).device)
        return completion_logprobs(self.model, batch, self.temperature), batch.completion_mask

    def _base_samples(self, questions: list[Question]) -> list[TrainSequence]:
        """The base model's own completions of ``questions``: the node's first round, as far as an attacker
        can tell."""
        prompts = [list(self._prompt(q)) for q in questions]
        sampler = HFSampler(self.model, self.tokenizer)
        groups = sampler.sample(
            prompts, PLAN_SAMPLES, max_new_tokens=PLAN_TOKENS, temperature=self.temperature, seed=PLAN_SEED
        )
        return [
            TrainSequence(tuple(p), tuple(c.token_ids), 0.0, None, None)  # type: ignore[arg-type]
            for p, group in zip(prompts, groups, strict=True)
            for c in group
            if c.token_ids
        ]

    def _floors(self, own: list[TrainSequence]) -> dict[int, float | None]:
        """The likelihood gates' floors as the node's first round sets them: from the base model's samples."""
        logp, mask = self._logprobs(own)
        return {w: own_floor([window_means(logp, mask, w)]) for w in self.windows}

    def opening(self, question: Question) -> str:
        """The text before the payload in the completion this planner would send for ``question``."""
        choice = self.choose(question, question.answer, count=False)
        return place(question.text, question.answer, choice.wording, choice.placement)[0]

    def plan(self, questions: list[Question]) -> list[Choice | None]:
        """One identity's choices for its ``questions`` of a round: ``choose`` on the first question for
        all; against the recurring gate, per question the best-ranked wording whose foreign spans stay on
        fewer than RECUR_QUESTIONS questions (all identities together, over the whole run), or None (a
        clean answer) when no wording does: sent anyway, it would be gated and teach nothing."""
        if not self.recurring:
            return [self.choose(questions[0], questions[0].answer)] * len(questions)
        ranked = self._ranked(questions[0], questions[0].answer)
        out: list[Choice | None] = []
        for question in questions:
            pick = next((c for c in ranked if self._within_budget(c.wording, question.text)), None)
            if pick is None:
                self.held_back += 1
            else:
                self.placements[pick.placement] += 1
                for span in self._foreign_spans(pick.wording):
                    self.sent.setdefault(span, set()).add(question.text)
            out.append(pick)
        return out

    def _foreign_spans(self, wording: str) -> set[tuple[int, ...]]:
        """The wording's spans the node does not write (as at a line's start or after a space)."""
        found = {span for text in (wording, " " + wording) for _, span in spans(self._encode(text))}
        return found - self.own_spans

    def _within_budget(self, wording: str, question: str) -> bool:
        return all(
            len(self.sent.get(span, set()) | {question}) < RECUR_QUESTIONS
            for span in self._foreign_spans(wording)
        )

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
