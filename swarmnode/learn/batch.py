"""Turning rollout groups into padded token batches for the learner.

Every sequence is (prompt tokens, completion tokens) in the *learner's* tokenizer. Local completions
keep the exact sampled token ids (and their behaviour log-probs); completions from a peer on another
tokenizer arrive as text and are re-tokenized here, so they have no usable behaviour log-probs.
Micro-batches are packed by a padded-token budget after sorting by length, so activation memory is
bounded by ``token_budget`` rather than by the number of completions, and padding stays low.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swarmnode.learn.grpo import group_advantages
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import RolloutGroup


@dataclass(frozen=True)
class TrainSequence:
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float
    behaviour_logprobs: tuple[float, ...] | None  # aligned with completion_ids, or None
    group: RolloutGroup

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
) -> list[TrainSequence]:
    """One TrainSequence per completion of every informative group (zero-advantage groups dropped)."""
    sequences = []
    for group in groups:
        if not group.informative:
            continue
        prompt = tuple(encode_prompt(tokenizer, group.question, system_prompt))
        advantages = group_advantages(torch.tensor(group.rewards, dtype=torch.float64), scale_advantages)
        same_tokenizer = group.provenance.tokenizer_fingerprint == tokenizer_fingerprint
        for completion, adv in zip(group.completions, advantages.tolist(), strict=True):
            if same_tokenizer and completion.token_ids is not None:
                ids, logprobs = completion.token_ids, completion.logprobs
            else:
                ids = tuple(tokenizer(completion.text, add_special_tokens=False)["input_ids"])
                if completion.finished and tokenizer.eos_token_id is not None:
                    ids += (tokenizer.eos_token_id,)
                logprobs = None
            if ids:
                sequences.append(TrainSequence(prompt, tuple(ids), adv, logprobs, group))
    return sequences


def microbatches(sequences: Sequence[TrainSequence], token_budget: int) -> list[list[TrainSequence]]:
    """Sort by length and pack so that (batch size x longest sequence) <= token_budget.

    A single sequence longer than the budget still gets its own micro-batch.
    """
    ordered = sorted(sequences, key=lambda s: s.length)
    batches: list[list[TrainSequence]] = []
    current: list[TrainSequence] = []
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
    """Left-padded so every sequence ends at the last position; completions occupy the tail."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    position_ids: torch.Tensor  # [B, L]
    completion_mask: torch.Tensor  # [B, C] over the last C positions' *targets*
    advantages: torch.Tensor  # [B]
    behaviour_logp: torch.Tensor  # [B, C], 0 where unknown
    has_behaviour: torch.Tensor  # [B, C] bool

    @property
    def completion_width(self) -> int:
        return self.completion_mask.shape[1]


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
    )


def completion_logprobs(
    model, batch: PaddedBatch, temperature: float = 1.0, autocast: torch.dtype | None = None
) -> torch.Tensor:
    """Log-prob of each completion token under ``model`` at the sampling temperature: [B, C] (0 where the
    mask is 0). Same temperature as the sampler, so ratios to behaviour log-probs are exact.

    With ``autocast`` the model's forward runs in that dtype (mixed precision); the log-softmax is always
    taken in float32. The LM head runs only on completion positions, in chunks (``head_logprobs``), so
    the [tokens, vocabulary] logits -- with a 49k vocabulary the largest activation of a small model --
    never exist whole; models whose head is not a plain projection (bias, soft-capping, scaling) take
    the model's own head on the last C+1 positions instead.
    """
    width = batch.completion_width
    mask = batch.completion_mask
    targets = batch.input_ids[:, -width:]
    inputs = dict(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: LoRA stays inside
    head = base.get_output_embeddings()
    device_type = batch.input_ids.device.type
    with torch.autocast(device_type, dtype=autocast or torch.float32, enabled=autocast is not None):
        if not _plain_head(base.config, head):
            logits = model(**inputs, logits_to_keep=width + 1).logits[:, :-1, :].float() / temperature
            return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
        hidden = base.get_decoder()(**inputs).last_hidden_state[:, -(width + 1) : -1]  # predicts the last C
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    out[mask] = head_logprobs(hidden[mask], head.weight, targets[mask], temperature, autocast)
    return out


def _plain_head(config, head) -> bool:
    """Whether logits = hidden @ head.weight.T exactly (what ``head_logprobs`` computes)."""
    scaled = any(
        getattr(config, name, None) not in (None, 1.0)
        for name in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")
    )
    return isinstance(head, torch.nn.Linear) and head.bias is None and not scaled


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    compute_dtype: torch.dtype | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """log softmax(hidden @ weight.T / temperature)[targets] for N rows: [N] (float32 or wider),
    differentiable in ``hidden`` and ``weight``. Rows go in chunks of ~4M logits (default), so memory
    stays flat in N."""
    chunk = chunk or max(1, 2**22 // weight.shape[0])
    return _HeadLogprobs.apply(hidden, weight, targets, temperature, compute_dtype or weight.dtype, chunk)


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 at least (bf16 logits would round the log-softmax), float64 if computing in it."""
    return torch.promote_types(dtype, torch.float32)


class _HeadLogprobs(torch.autograd.Function):
    """Forward keeps only the per-row log-sum-exp; backward recomputes each chunk's logits, trading one
    more head matmul for never holding [N, V] activations or their gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, dtype, chunk):
        w = weight.to(dtype)
        out = torch.empty(len(targets), dtype=_softmax_dtype(dtype), device=hidden.device)
        lse = torch.empty_like(out)
        for s in range(0, len(targets), chunk):
            logits = (hidden[s : s + chunk].to(dtype) @ w.T).to(out.dtype) / temperature
            lse[s : s + chunk] = logits.logsumexp(-1)
            out[s : s + chunk] = (
                logits.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - lse[s : s + chunk]
            )
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.dtype, ctx.chunk = temperature, dtype, chunk
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lse = ctx.saved_tensors
        temperature, dtype, chunk = ctx.temperature, ctx.dtype, ctx.chunk
        w = weight.to(dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device)
        for s in range(0, len(targets), chunk):
            h = hidden[s : s + chunk].to(dtype)
            g_out = grad_out[s : s + chunk, None]
            logits = (h @ w.T).to(lse.dtype) / temperature
            # d log p[target] / d logits = (onehot(target) - softmax) / temperature
            grad = (logits - lse[s : s + chunk, None]).exp_().mul_(-g_out)
            grad.scatter_add_(-1, targets[s : s + chunk, None], g_out)
            grad = grad.div_(temperature).to(dtype)
            if grad_hidden is not None:
                grad_hidden[s : s + chunk] = grad @ w
            if grad_weight is not None:
                grad_weight += (grad.T @ h).to(lse.dtype)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def sampler_vs_learner_logprobs(
    model, pad_id: int, prompts: Sequence[Sequence[int]], groups, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs the sampler recorded, ``model``'s own log-probs of the same tokens at ``temperature``),
    flattened over the completion tokens of ``groups`` (one list of Completions per prompt): how far a
    sampling backend's numbers are from the learner's."""
    sequences = [
        TrainSequence(tuple(prompt), c.token_ids, 0.0, c.logprobs, None)  # type: ignore[arg-type]
        for prompt, group in zip(prompts, groups, strict=True)
        for c in group
    ]
    batch = pad_batch(sequences, pad_id, next(model.parameters()).device)
    with torch.no_grad():
        learner = completion_logprobs(model, batch, temperature)
    mask = batch.completion_mask
    return batch.behaviour_logp[mask], learner[mask]
