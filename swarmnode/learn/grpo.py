"""GRPO/DAPO policy loss, written as small pure functions.

Where this departs from textbook GRPO (Shao et al. 2024):
- token-level aggregation (DAPO): the loss is a sum over every completion token in the batch divided
  by the batch's total token count, so long completions are not down-weighted per token and
  micro-batches accumulate to exactly the full-batch loss;
- asymmetric clipping (DAPO clip-higher): ratio clipped to [1 - clip_low, 1 + clip_high];
- groups whose rewards are all equal carry no signal (zero advantage) and are dropped before the
  update rather than diluting the token mean;
- the KL penalty to a reference policy is optional (k3 estimator) and off by default;
- ``token_weight`` and ``mask`` are where off-policy corrections plug in (importance weights,
  masking of out-of-range ratios); on on-policy data both are 1 and this is plain GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean) / (std + eps) within one question group; std is the unbiased sample std as in GRPO."""
    centred = rewards - rewards.mean()
    if not scale or rewards.numel() < 2:
        return centred
    return centred / (rewards.std() + eps)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor | None, kl_beta: float) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 (unbiased, >= 0);
    zeros when the penalty is off."""
    if ref_logp is None or kl_beta <= 0:
        return torch.zeros_like(logp)
    log_r = ref_logp - logp
    return torch.exp(log_r) - log_r - 1.0


def kl_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, *, kl_beta: float, total_tokens: int
) -> tuple[torch.Tensor, float]:
    """kl_beta * sum of k3(pi || ref) over ``mask`` / total_tokens, and the k3 token sum (a float): a KL
    term to a second reference next to ``policy_loss``'s own (ReMix's KL-convex constraint)."""
    kl = k3_kl(logp, ref_logp, kl_beta) * mask.to(logp.dtype)
    return kl_beta * kl.sum() / max(total_tokens, 1), float(kl.detach().sum().item())


@dataclass
class LossTerms:
    """Token sums of one micro-batch; divide by the batch's token count to get means."""

    loss: torch.Tensor  # differentiable, already divided by total_tokens
    pg_sum: float
    kl_sum: float
    clipped_low: int
    clipped_high: int
    tokens: int


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    total_tokens: int,
    token_weight: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    clip_centre: torch.Tensor | None = None,
) -> LossTerms:
    """Clipped surrogate with token-level aggregation.

    Shapes: ``logp``, ``old_logp``, ``mask``, ``token_weight``, ``ref_logp`` are [B, T]; ``advantages``
    is [B] (one value per completion, broadcast over its tokens). ``mask`` is 1 on completion tokens
    that count. ``total_tokens`` is the mask sum over the *whole* batch (all micro-batches).
    ``clip_centre`` (default 1) moves the clip window to [centre - clip_low, centre + clip_high], which
    is how mix-policy clipping (ReMix) reuses this loss with ``old_logp`` set to the behaviour policy.
    """
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    centre = torch.ones_like(ratio) if clip_centre is None else clip_centre.to(ratio.dtype)
    lower, upper = centre - clip_low, centre + clip_high
    clipped = torch.minimum(torch.maximum(ratio, lower), upper)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    if token_weight is not None:
        per_token = per_token * token_weight
    kl = k3_kl(logp, ref_logp, kl_beta)
    per_token = per_token + kl_beta * kl
    loss = (per_token * mask).sum() / max(total_tokens, 1)
    with torch.no_grad():
        low = ((ratio < lower) & (adv < 0) & (mask > 0)).sum().item()
        high = ((ratio > upper) & (adv > 0) & (mask > 0)).sum().item()
        pg = -(torch.minimum(ratio * adv, clipped * adv) * mask).sum().item()
    return LossTerms(
        loss=loss,
        pg_sum=pg,
        kl_sum=float((kl.detach() * mask).sum().item()),
        clipped_low=int(low),
        clipped_high=int(high),
        tokens=int(mask.sum().item()),
    )
