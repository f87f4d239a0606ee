"""Off-policy correction by source: what the GRPO loss needs for data the learner did not just sample.

Notation, per completion token (all tensors [B, T]):
- ``logp``: log pi_theta, the learner being optimised (carries the gradient);
- ``old_logp``: log pi_old, the learner at the start of this round's update, computed without grad;
- ``behaviour_logp``: log mu, what the sampler recorded: an older version of this node (async sampler,
  replay) or a same-model peer. ``has_behaviour`` is False where there is none (padding, a sampler
  without log-probs, a peer on another tokenizer whose text was re-tokenized).

Modes (the ``type`` of the correction, one per node config):
- ``none``: importance ratio pi_old/mu taken as 1 -- the SAPO baseline (the PPO ratio pi_theta/pi_old
  still applies across several updates of one round);
- ``tis``: truncated importance sampling, token weight min(pi_old/mu, C) on the PPO term (Yao et al.
  2025, "Your efficient RL framework secretly brings you off-policy RL training");
- ``icepop``: the ratio pi_old/mu is kept as the token weight only inside [alpha, beta]; other tokens
  leave the loss *and* its denominator (IcePop, Ling team 2025, "Every step evolves", arXiv 2510.18855);
- ``remix``: mix-policy proximal policy gradient for the node's *own* replayed data (ReMix, Liang et al.
  2025, arXiv 2507.06892, built on GePPO, Queeney et al. 2021, arXiv 2111.00072): see
  ``remix_policy_loss``;
- ``luffy``: ratio-free policy shaping f(p) = p / (p + gamma) on tokens that have no behaviour
  log-probs (LUFFY, Yan et al. 2025, arXiv 2504.14945); tokens that do have them get ratio 1.

Where a mode needs mu but a token has none, mu := pi_old there: the ratio is 1 and the token is trained
as plain GRPO. On exactly on-policy data (mu == pi_old == pi_theta) every mode is plain GRPO.

Trust: peers' behaviour log-probs are untrusted. They pass through ``sanitize_behaviour_logp`` (clamped
to [floor, 0]) and then enter the loss only through truncation (``tis``: weight <= C) or masking
(``icepop``: weight in [alpha, beta] or the token is dropped); with ``trusted=False`` (peer data) every
token weight is further capped at ``UNTRUSTED_WEIGHT_CAP`` = 1, so a claim can lower a peer token's
weight but never raise it above a local token's. A NaN log-prob means "unknown" (e.g. after the point
where a peer's ids and the learner's re-tokenization part ways): the token is treated as having none,
ratio 1. ``none`` and ``luffy`` ignore them; ``remix`` uses mu unbounded and must only be given the
node's own replayed rollouts.

How the trainer uses this, per round:
1. compute ``old_logp`` for every micro-batch *before* the update (needed even with one update per
   round: ``icepop`` changes the token count);
2. ``c = correction_for(mode, old_logp=..., behaviour_logp=..., has_behaviour=..., mask=...)`` per
   micro-batch; ``total_tokens = sum(c.tokens)``;
3. per update and micro-batch: ``corrected_loss(c, logp, old_logp, advantages, total_tokens=...)``.
``c.stats`` are the diagnostics (``CorrectionStats``); ``ess_lr_scale`` turns their ESS into a learning-rate
factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from swarmnode.learn.grpo import LossTerms, k3_kl, policy_loss

Mode = Literal["none", "tis", "icepop", "remix", "luffy"]
MODES: tuple[Mode, ...] = ("none", "tis", "icepop", "remix", "luffy")

TIS_CAP = 2.0  # C: largest token weight min(pi_old/mu, C) that tis applies
ICEPOP_LOW = 0.5  # alpha: tokens with pi_old/mu below this leave the loss
ICEPOP_HIGH = 5.0  # beta: tokens with pi_old/mu above this leave the loss
LUFFY_GAMMA = 0.1  # gamma in the shaping f(p) = p / (p + gamma)
BEHAVIOUR_LOGP_FLOOR = -20.0  # lowest behaviour log-prob believed (mu >= 2e-9)
UNTRUSTED_WEIGHT_CAP = 1.0  # largest token weight for data whose behaviour log-probs are a peer's claim

# ----------------------------------------------------------------------------------------------------
# Behaviour log-probs


def sanitize_behaviour_logp(
    logp: torch.Tensor, has_behaviour: torch.Tensor, *, floor: float = BEHAVIOUR_LOGP_FLOOR
) -> torch.Tensor:
    """Clamp claimed log-probs to [floor, 0]: +inf and positive values -> 0 (mu = 1), -inf -> floor.

    NaN means unknown: ``correction_for`` treats such a token as having no behaviour log-prob (ratio 1);
    here it becomes the floor only so that the tensor stays finite. Positions without behaviour
    log-probs are returned as 0 (the batching convention); they are never used as mu. Untrusted values
    are only ever used through truncation or masking (module docstring).
    """
    clean = torch.nan_to_num(logp.detach(), nan=floor, posinf=0.0, neginf=floor).clamp(floor, 0.0)
    return torch.where(has_behaviour.bool(), clean, torch.zeros_like(clean))


def importance_ratio(
    old_logp: torch.Tensor, behaviour_logp: torch.Tensor, usable: torch.Tensor
) -> torch.Tensor:
    """pi_old / mu per token (detached), 1 where ``usable`` is False (no behaviour log-prob, padding)."""
    log_ratio = torch.where(usable, old_logp.detach() - behaviour_logp, torch.zeros_like(old_logp))
    return torch.exp(log_ratio)


# ----------------------------------------------------------------------------------------------------
# Per-mode token weights and masks (pure, detached)


def tis_weight(ratio: torch.Tensor, cap: float = TIS_CAP) -> torch.Tensor:
    """Truncated importance weight min(pi_old/mu, C): the variance of one token's term is bounded by C."""
    return ratio.clamp(max=cap)


def icepop_keep(ratio: torch.Tensor, low: float = ICEPOP_LOW, high: float = ICEPOP_HIGH) -> torch.Tensor:
    """Tokens whose ratio pi_old/mu lies in [alpha, beta] (bounds included); the rest are masked out."""
    return (ratio >= low) & (ratio <= high)


def luffy_shaping(p: torch.Tensor, gamma: float = LUFFY_GAMMA) -> torch.Tensor:
    """f(p) = p / (p + gamma): LUFFY's regularised importance sampling with behaviour prob taken as 1."""
    return p / (p + gamma)


def luffy_token_weight(logp: torch.Tensor, gamma: float = LUFFY_GAMMA) -> torch.Tensor:
    """d f(p) / d log p = p * gamma / (p + gamma)^2, detached.

    With p = exp(logp): d f / d p = gamma / (p + gamma)^2 and d p / d log p = p. Used as ``token_weight``
    in ``policy_loss`` at ratio 1 (first update of a round), it gives exactly LUFFY's gradient; it peaks at
    1/4 for p = gamma. Relative to the unshaped p * grad log p it multiplies by gamma / (p + gamma)^2:
    up to 1/gamma for rare tokens, ~gamma/p^2 for confident ones.
    """
    p = logp.detach().exp()
    return p * gamma / (p + gamma) ** 2


# ----------------------------------------------------------------------------------------------------
# Loss variants (token-level aggregation as in grpo.policy_loss: token sum / total_tokens)


def remix_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    total_tokens: int,
    ref_logp: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> LossTerms:
    """ReMix / GePPO mix-policy clipped surrogate for data sampled by an older policy mu = pi_{k-i}.

    ratio r = pi_theta / mu, centre w = pi_old / mu (pi_old = pi_k, the learner before this update),
    per token: -min(r * A, clip(r, w - clip_low, w + clip_high) * A).
    The window is additive around w, as in GePPO's reference code (``clip(ratio, offpol_ratio - eps,
    offpol_ratio + eps)``): it bounds |pi_theta - pi_old| / mu, i.e. the total-variation step measured on
    the behaviour policy's samples. With mu == pi_old (w = 1) this is exactly ``grpo.policy_loss``.
    A *multiplicative* window w * [1 - eps, 1 + eps] would instead equal ``policy_loss`` with token weight
    w, i.e. untruncated importance sampling. Requires trusted mu (the node's own replay): w is unbounded.
    ``clipped_low``/``clipped_high`` count tokens whose r left the window on the side that stops the
    gradient (below with A < 0, above with A > 0).
    """
    centre = torch.exp(old_logp.detach() - behaviour_logp)
    return policy_loss(
        logp,
        behaviour_logp,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        total_tokens=total_tokens,
        ref_logp=ref_logp,
        kl_beta=kl_beta,
        clip_centre=centre,
    )


def remix_kl_coef(step: int) -> float:
    """ReMix KL-Convex schedule lambda(t) = max(1 - 0.1 * ceil(max(t - 50, 0) / 10), 0.5).

    lambda weights the KL to the base model and 1 - lambda the KL to the precedent (pre-update) policy:
    1 up to step 50, then 0.1 less every 10 steps (51-60: 0.9, 61-70: 0.8, ...), never below 0.5.
    """
    over = max(step - 50, 0)
    tens = -(-over // 10)  # integer ceil(over / 10): no float rounding at the step boundaries
    return max(1.0 - 0.1 * tens, 0.5)


def luffy_policy_loss(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = LUFFY_GAMMA,
    total_tokens: int,
    ref_logp: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> LossTerms:
    """LUFFY's off-policy term: per token -A * f(pi_theta(token)), f(p) = p / (p + gamma); no clipping.

    For tokens with no usable behaviour log-prob (a peer on another tokenizer): LUFFY takes the behaviour
    probability as 1, so the importance ratio is f(pi_theta) / 1. The gradient per token is
    -A * p * gamma / (p + gamma)^2 * grad log p (see ``luffy_token_weight``); it does not reduce to GRPO
    (-A * grad log p) for any p, which is why ``luffy`` mode applies it only to tokens without behaviour
    log-probs. Summed over tokens and divided by ``total_tokens``, like ``grpo.policy_loss``.
    """
    valid = mask.bool()
    fmask = valid.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    # padding may hold garbage log-probs: evaluate f at p = 1 there (finite; multiplied by 0 anyway)
    p = torch.where(valid, logp, torch.zeros_like(logp)).exp()
    surrogate = luffy_shaping(p, gamma) * adv
    kl = k3_kl(logp, ref_logp, kl_beta)
    per_token = -surrogate + kl_beta * kl
    loss = (per_token * fmask).sum() / max(total_tokens, 1)
    return LossTerms(
        loss=loss,
        pg_sum=float(-(surrogate.detach() * fmask).sum().item()),
        kl_sum=float((kl.detach() * fmask).sum().item()),
        clipped_low=0,
        clipped_high=0,
        tokens=int(fmask.sum().item()),
    )


# ----------------------------------------------------------------------------------------------------
# Diagnostics


def effective_sample_size(weights: torch.Tensor, mask: torch.Tensor) -> float:
    """Normalised ESS (sum w)^2 / (n * sum w^2) over tokens where ``mask`` is set (Kish).

    1.0 for uniform weights, ~1/n when one weight dominates. 1.0 when no token counts (nothing to
    correct); 0.0 when every weight is 0.
    """
    w = weights.detach().double()[mask.bool()]
    n = w.numel()
    if n == 0:
        return 1.0
    sq = float((w * w).sum())
    if sq == 0.0:
        return 0.0
    return float(w.sum()) ** 2 / (n * sq)


def ess_lr_scale(ess: float, ess_base: float) -> float:
    """VCPO-style learning-rate damping sqrt(min(1, ess / ess_base)): 1 while ESS >= ess_base."""
    if ess_base <= 0:
        raise ValueError(f"ess_base must be > 0, got {ess_base}")
    return math.sqrt(min(1.0, max(ess, 0.0) / ess_base))


def kl_behaviour_k1(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, usable: torch.Tensor) -> float:
    """KL(mu || pi_old) estimated with k1 = mean(log mu - log pi_old) over ``usable`` tokens.

    Unbiased because the tokens were sampled from mu; a single estimate can be negative. 0.0 if none.
    """
    usable = usable.bool()
    n = int(usable.sum())
    if n == 0:
        return 0.0
    diff = (behaviour_logp - old_logp.detach()).double()[usable]
    return float(diff.sum()) / n


# ----------------------------------------------------------------------------------------------------
# Dispatcher


@dataclass(frozen=True)
class CorrectionStats:
    """One micro-batch's diagnostics of its correction (``correction_for``); the trainer sums them over an
    update (``trainer.UpdateTotals``)."""

    tokens: float  # completion tokens
    kept_tokens: float  # those still counted after masking
    behaviour_frac: float  # share of tokens with behaviour log-probs
    ratio_mean: float  # raw pi_old/mu over tokens with behaviour log-probs (1 if none)
    ratio_max: float
    # the factor by which the mode scales each kept token's GRPO gradient at the start of the update
    # (none 1; tis min(r, C); icepop r; remix r; luffy p*gamma/(p+gamma)^2 on shaped tokens)
    weight_mean: float
    weight_max: float
    clip_frac: float  # share of tokens whose tis weight was truncated
    mask_frac: float  # share of tokens icepop dropped
    ess: float  # ``effective_sample_size`` of those weights over kept tokens
    weight_sum: float  # with weight_sq_sum: the ESS over several micro-batches
    weight_sq_sum: float
    kl_k1: float  # ``kl_behaviour_k1``, KL(mu || pi_old) by the k1 estimator


@dataclass(frozen=True, eq=False)
class Correction:
    """What one micro-batch's loss needs for a given mode, and the diagnostics.

    ``token_weight``: detached [B, T] weight on the PPO term, None = 1 (none, remix, luffy).
    ``mask``: bool [B, T], the tokens that count; its sum over the batch is ``total_tokens``.
    ``behaviour_logp``: sanitized mu, with mu := pi_old where there is none (used by remix).
    ``stats``: the diagnostics (``CorrectionStats``).
    ``shaped``: bool [B, T] tokens trained with LUFFY shaping (luffy mode), else None.
    """

    mode: Mode
    token_weight: torch.Tensor | None
    mask: torch.Tensor
    behaviour_logp: torch.Tensor
    stats: CorrectionStats
    shaped: torch.Tensor | None = None
    gamma: float = LUFFY_GAMMA

    @property
    def tokens(self) -> int:
        return int(self.mask.sum().item())


def correction_for(
    mode: Mode,
    *,
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    has_behaviour: torch.Tensor,
    mask: torch.Tensor,
    tis_cap: float = TIS_CAP,
    icepop_low: float = ICEPOP_LOW,
    icepop_high: float = ICEPOP_HIGH,
    luffy_gamma: float = LUFFY_GAMMA,
    floor: float = BEHAVIOUR_LOGP_FLOOR,
    trusted: bool = True,
) -> Correction:
    """Token weights, mask and diagnostics of ``mode`` for one micro-batch (all inputs [B, T]).

    ``behaviour_logp``/``has_behaviour`` are ``PaddedBatch``'s; they are sanitized here (NaN: none).
    ``mask`` is the completion mask. ``trusted=False`` (peers' data): token weights are capped at
    ``UNTRUSTED_WEIGHT_CAP``. The diagnostics are ``CorrectionStats``.
    """
    if mode not in MODES:
        raise ValueError(f"unknown off-policy correction {mode!r}; choose one of {', '.join(MODES)}")
    if not (old_logp.shape == behaviour_logp.shape == has_behaviour.shape == mask.shape):
        raise ValueError(
            "old_logp, behaviour_logp, has_behaviour and mask must have one shape, got "
            f"{tuple(old_logp.shape)}, {tuple(behaviour_logp.shape)}, {tuple(has_behaviour.shape)}, "
            f"{tuple(mask.shape)}"
        )
    old_logp = old_logp.detach()
    valid = mask.bool()
    usable = valid & has_behaviour.bool() & ~torch.isnan(behaviour_logp)
    mu = sanitize_behaviour_logp(behaviour_logp.to(old_logp.dtype), usable, floor=floor)
    mu = torch.where(usable, mu, old_logp)  # no behaviour log-prob: mu := pi_old, ratio 1
    ratio = importance_ratio(old_logp, mu, usable)

    token_weight: torch.Tensor | None = None
    keep = valid
    shaped: torch.Tensor | None = None
    effective = torch.ones_like(ratio)  # per-token gradient factor relative to GRPO, for diagnostics
    clip_frac = mask_frac = 0.0
    n_valid = int(valid.sum())
    if mode == "tis":
        token_weight = tis_weight(ratio, tis_cap)
        effective = token_weight
        clip_frac = int((usable & (ratio > tis_cap)).sum()) / max(n_valid, 1)
    elif mode == "icepop":
        keep = valid & icepop_keep(ratio, icepop_low, icepop_high)
        token_weight = torch.where(keep, ratio, torch.zeros_like(ratio))
        effective = token_weight
        mask_frac = int((valid & ~keep).sum()) / max(n_valid, 1)
    elif mode == "remix":
        effective = ratio  # d/dlogp of r * A at theta = theta_old is w * A, inside the window
    elif mode == "luffy":
        shaped = valid & ~has_behaviour.bool()
        effective = torch.where(shaped, luffy_token_weight(old_logp, luffy_gamma), effective)
    if not trusted and token_weight is not None:
        token_weight = token_weight.clamp(max=UNTRUSTED_WEIGHT_CAP)
        effective = token_weight

    kept_w = effective.detach().double()[keep]
    raw = ratio.double()[usable]
    stats = CorrectionStats(
        tokens=float(n_valid),
        kept_tokens=float(keep.sum()),
        behaviour_frac=int(usable.sum()) / max(n_valid, 1),
        ratio_mean=float(raw.mean()) if raw.numel() else 1.0,
        ratio_max=float(raw.max()) if raw.numel() else 1.0,
        weight_mean=float(kept_w.mean()) if kept_w.numel() else 1.0,
        weight_max=float(kept_w.max()) if kept_w.numel() else 1.0,
        clip_frac=clip_frac,
        mask_frac=mask_frac,
        ess=effective_sample_size(effective, keep),
        weight_sum=float(kept_w.sum()),
        weight_sq_sum=float((kept_w**2).sum()),
        kl_k1=kl_behaviour_k1(old_logp, mu, usable),
    )
    return Correction(
        mode=mode,
        token_weight=token_weight,
        mask=keep,
        behaviour_logp=mu,
        stats=stats,
        shaped=shaped,
        gamma=luffy_gamma,
    )


def _sum_terms(a: LossTerms, b: LossTerms) -> LossTerms:
    """Both terms divide by the same total_tokens over disjoint masks, so their sum is the batch loss."""
    return LossTerms(
        loss=a.loss + b.loss,
        pg_sum=a.pg_sum + b.pg_sum,
        kl_sum=a.kl_sum + b.kl_sum,
        clipped_low=a.clipped_low + b.clipped_low,
        clipped_high=a.clipped_high + b.clipped_high,
        tokens=a.tokens + b.tokens,
    )


def corrected_loss(
    correction: Correction,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    total_tokens: int,
    ref_logp: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> LossTerms:
    """The micro-batch loss for ``correction.mode``; ``total_tokens`` = sum of ``Correction.tokens``.

    none/tis/icepop: ``grpo.policy_loss`` with the correction's token weight and mask; remix:
    ``remix_policy_loss``; luffy: ``policy_loss`` on tokens with behaviour log-probs plus
    ``luffy_policy_loss`` on the shaped ones.
    """
    c = correction
    common = {"total_tokens": total_tokens, "ref_logp": ref_logp, "kl_beta": kl_beta}
    if c.mode == "remix":
        return remix_policy_loss(
            logp,
            old_logp,
            c.behaviour_logp,
            advantages,
            c.mask,
            clip_low=clip_low,
            clip_high=clip_high,
            **common,
        )
    plain = policy_loss(
        logp,
        old_logp,
        advantages,
        c.mask if c.shaped is None else c.mask & ~c.shaped,
        clip_low=clip_low,
        clip_high=clip_high,
        token_weight=c.token_weight,
        **common,
    )
    if c.shaped is None:
        return plain
    return _sum_terms(plain, luffy_policy_loss(logp, advantages, c.shaped, gamma=c.gamma, **common))
