"""Turning rollout groups into padded token batches for the learner.

Every sequence is (prompt tokens, completion tokens) in the *learner's* tokenizer. Local completions
keep the exact sampled token ids (and their behaviour log-probs). A peer's completion is always
re-tokenized from its text, the text the verifier scored, whatever ids the peer sent: its log-probs are
kept only on the common prefix of its ids and ours (NaN after it: unknown, neutral in ``offpolicy``).
So a peer cannot make the learner push up a token sequence other than the scored text, nor hand it an
id outside the vocabulary. A peer group whose completions re-tokenize longer than
``PEER_TOKEN_FACTOR`` x this node's ``max_new_tokens`` (+1 for EOS) is dropped, which bounds one peer
group's token weight in the loss relative to a local group's; so is a peer group whose conversion
raises (logged): peer data never ends a round.
Micro-batches are packed by a padded-token budget after sorting by length, so activation memory is
bounded by ``token_budget`` rather than by the number of completions, and padding stays low.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from swarmnode.learn.grpo import group_advantages
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Completion, RolloutGroup

log = logging.getLogger(__name__)

PEER_TOKEN_FACTOR = 2  # a peer completion may re-tokenize to this many times our max_new_tokens (+EOS)


@dataclass(frozen=True)
class TrainSequence:
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float
    behaviour_logprobs: tuple[float, ...] | None  # aligned with completion_ids, or None
    group: RolloutGroup
    gated: frozenset[int] = frozenset()  # completion positions a peer defence keeps out (learn/recurring.py)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def to_sequences(
    groups: Sequence[RolloutGroup],
    tokenizer,
    tokenizer_fingerprint: str,
    *,
    scale_advantages: bool,
    system_prompt: str | None = None,
    max_new_tokens: int | None = None,
) -> list[TrainSequence]:
    """One TrainSequence per completion of every informative group (zero-advantage groups dropped).

    ``max_new_tokens`` (this node's sampling cap) bounds peer completions (module docstring); None: no
    bound. Errors in a local group propagate; a peer group that fails is dropped and logged.
    """
    sequences = []
    limit = None if max_new_tokens is None else PEER_TOKEN_FACTOR * max_new_tokens + 1
    for group in groups:
        if not group.informative:
            continue
        if group.provenance.source == "local":
            sequences += _group_sequences(
                group, tokenizer, tokenizer_fingerprint, scale_advantages, system_prompt
            )
            continue
        try:
            converted = _group_sequences(
                group, tokenizer, tokenizer_fingerprint, scale_advantages, system_prompt
            )
        except Exception as exc:  # noqa: BLE001 - peer data must never end the round
            log.warning("dropped a group from peer %.16s: %s", group.provenance.producer, type(exc).__name__)
            continue
        if limit is not None and any(len(s.completion_ids) > limit for s in converted):
            log.debug(
                "dropped a group from peer %.16s: completions over %d tokens",
                group.provenance.producer,
                limit,
            )
            continue
        sequences += converted
    return sequences


def own_untrained_sequences(
    groups: Sequence[RolloutGroup], tokenizer, tokenizer_fingerprint: str, *, system_prompt: str | None = None
) -> list[TrainSequence]:
    """One TrainSequence (advantage 0) per completion of this node's own zero-advantage groups, the ones
    ``to_sequences`` drops: they never train, but they are this node's own text of the round, and the span
    gate takes its floors from all of it (``Trainer.step``'s ``floor_only``, ``peer_defence``)."""
    sequences = []
    for group in groups:
        if group.provenance.source == "local" and not group.informative:
            sequences += _group_sequences(group, tokenizer, tokenizer_fingerprint, False, system_prompt)
    return sequences


def _group_sequences(
    group: RolloutGroup, tokenizer, fingerprint: str, scale_advantages: bool, system_prompt: str | None
) -> list[TrainSequence]:
    prompt = tuple(encode_prompt(tokenizer, group.question, system_prompt))
    advantages = group_advantages(torch.tensor(group.rewards, dtype=torch.float64), scale_advantages)
    same_tokenizer = group.provenance.tokenizer_fingerprint == fingerprint
    local = group.provenance.source == "local"
    out = []
    for completion, adv in zip(group.completions, advantages.tolist(), strict=True):
        if local and same_tokenizer and completion.token_ids is not None:
            ids, logprobs = tuple(completion.token_ids), completion.logprobs
        else:
            ids = tuple(tokenizer(completion.text, add_special_tokens=False)["input_ids"])
            if completion.finished and tokenizer.eos_token_id is not None:
                ids += (tokenizer.eos_token_id,)
            logprobs = _agreeing_logprobs(completion, ids) if same_tokenizer and not local else None
        if ids:
            out.append(TrainSequence(prompt, ids, adv, logprobs, group))
    return out


def _agreeing_logprobs(completion: Completion, ids: tuple[int, ...]) -> tuple[float, ...] | None:
    """The peer's log-probs on the common prefix of its ids and ``ids`` (ours), NaN after; None if the
    prefix is empty or the peer sent none."""
    theirs, logprobs = completion.token_ids, completion.logprobs
    if theirs is None or logprobs is None or len(logprobs) != len(theirs):
        return None
    n = 0
    for a, b in zip(theirs, ids, strict=False):
        if a != b:
            break
        n += 1
    return tuple(logprobs[:n]) + (math.nan,) * (len(ids) - n) if n else None


class _Measured(Protocol):
    @property
    def length(self) -> int: ...


Item = TypeVar("Item", bound=_Measured)


def microbatches(sequences: Sequence[Item], token_budget: int) -> list[list[Item]]:
    """Sort by length and pack so that (batch size x longest sequence) <= token_budget.

    A single sequence longer than the budget still gets its own micro-batch. Works on anything with a
    ``length`` in tokens (sequences here, rows of the shared-prompt layout in ``shared.py``).
    """
    ordered = sorted(sequences, key=lambda s: s.length)
    batches: list[list[Item]] = []
    current: list[Item] = []
    for seq in ordered:
        if current and (len(current) + 1) * seq.length > token_budget:
            batches.append(current)
            current = []
        current.append(seq)
    if current:
        batches.append(current)
    return batches


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as one left-padded batch (input ids, attention mask), so generation continues every
    prompt from the same last position."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt))
        attention[row, width - len(prompt) :] = 1
    return input_ids, attention


@dataclass
class PaddedBatch:
    """The model's input and, per completion, its tokens' targets, right-aligned in [B, C].

    Plain layout (``pad_batch``): one row per sequence, left-padded so every sequence ends at the last
    position; completions occupy the tail and ``hidden_index`` is None. Shared-prompt layout
    (``shared.shared_batch``): R rows hold prompts once and completions after them, ``attention_mask`` is
    a [R, 1, L, L] block mask and ``hidden_index`` says which position predicts each completion token.
    """

    input_ids: torch.Tensor  # [R, L]
    attention_mask: torch.Tensor  # [R, L] padding mask, or [R, 1, L, L] bool block mask
    position_ids: torch.Tensor  # [R, L]
    completion_mask: torch.Tensor  # [B, C] over the last C positions' *targets*
    advantages: torch.Tensor  # [B]
    behaviour_logp: torch.Tensor  # [B, C], 0 where unknown
    has_behaviour: torch.Tensor  # [B, C] bool
    hidden_index: torch.Tensor | None = None  # [B, C] flat index into [R * L] of each token's predictor
    targets: torch.Tensor | None = None  # [B, C] completion token ids (shared layout)
    sequences: tuple[TrainSequence, ...] = ()  # the B completions, in row order (shared layout)
    keep_mask: torch.Tensor | None = None  # [B, C] False at ``TrainSequence.gated`` tokens; None: none are

    @property
    def completion_width(self) -> int:
        return self.completion_mask.shape[1]


def keep_mask(sequences: Sequence[TrainSequence], width: int, device: torch.device) -> torch.Tensor | None:
    """[B, width] right-aligned: False at each sequence's ``gated`` completion positions; None if none has
    any (the learner then adds no mask)."""
    if not any(s.gated for s in sequences):
        return None
    keep = torch.ones((len(sequences), width), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        offset = width - len(seq.completion_ids)
        for i in seq.gated:
            keep[row, offset + i] = False
    return keep.to(device)


def pad_batch(sequences: Sequence[TrainSequence], pad_id: int, device: torch.device) -> PaddedBatch:
    length = max(s.length for s in sequences)
    width = max(len(s.completion_ids) for s in sequences)
    n = len(sequences)
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.long)
    completion_mask = torch.zeros((n, width), dtype=torch.bool)
    behaviour = torch.zeros((n, width), dtype=torch.float32)
    has_behaviour = torch.zeros((n, width), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        ids = seq.prompt_ids + seq.completion_ids
        input_ids[row, length - len(ids) :] = torch.tensor(ids)
        attention[row, length - len(ids) :] = 1
        c = len(seq.completion_ids)
        completion_mask[row, width - c :] = True
        if seq.behaviour_logprobs is not None:
            behaviour[row, width - c :] = torch.tensor(seq.behaviour_logprobs, dtype=torch.float32)
            has_behaviour[row, width - c :] = True
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return PaddedBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        completion_mask=completion_mask.to(device),
        advantages=torch.tensor([s.advantage for s in sequences], dtype=torch.float32, device=device),
        behaviour_logp=behaviour.to(device),
        has_behaviour=has_behaviour.to(device),
        keep_mask=keep_mask(sequences, width, device),
    )
