"""Off-policy corrections against hand-computed values.

Shared 1x3 example (used by the none/tis/icepop/remix tests), probabilities per token:
    pi_old = (0.5, 0.5, 0.2), mu = (0.05, 0.4, 0.8)  ->  r = pi_old / mu = (10, 1.25, 0.25)
    logp = pi_old (first update of a round: the PPO ratio pi_theta / pi_old is 1), A = +1.
"""

import math
from dataclasses import astuple

import pytest
import torch

from swarmnode.learn.grpo import policy_loss
from swarmnode.learn.offpolicy import (
    MODES,
    corrected_loss,
    correction_for,
    effective_sample_size,
    ess_lr_scale,
    icepop_keep,
    luffy_policy_loss,
    luffy_token_weight,
    remix_kl_coef,
    remix_policy_loss,
    sanitize_behaviour_logp,
    tis_weight,
)

CLIP = {"clip_low": 0.2, "clip_high": 0.28}
LN = math.log


def _logp(*probs, grad=False):
    return torch.tensor([[LN(p) for p in probs]], dtype=torch.float64, requires_grad=grad)


def _example():
    old = _logp(0.5, 0.5, 0.2)
    mu = _logp(0.05, 0.4, 0.8)
    has = torch.ones(1, 3, dtype=torch.bool)
    mask = torch.ones(1, 3, dtype=torch.bool)
    return old, mu, has, mask


def _run(mode, logp, old, mu, has, mask, adv, **kw):
    """Correction, then the loss with total_tokens taken from the correction's mask; returns (terms, grad)."""
    c = correction_for(mode, old_logp=old, behaviour_logp=mu, has_behaviour=has, mask=mask, **kw)
    leaf = logp.detach().clone().requires_grad_(True)
    terms = corrected_loss(c, leaf, old, adv, total_tokens=c.tokens, **CLIP)
    terms.loss.backward()
    return c, terms, leaf.grad


# ------------------------------------------------------------------------------------------------
# Each mode on the shared example: exact weights, masks, loss values


def test_none_is_ratio_one():
    old, mu, has, mask = _example()
    c, terms, grad = _run("none", old, old, mu, has, mask, torch.tensor([1.0]))
    assert c.token_weight is None and c.mask.tolist() == [[True, True, True]]
    # -(1 + 1 + 1) / 3 = -1; each token's gradient -A / 3
    assert terms.loss.item() == pytest.approx(-1.0)
    assert grad.flatten().tolist() == pytest.approx([-1 / 3] * 3)
    # diagnostics still describe the data: r = (10, 1.25, 0.25)
    assert c.stats.ratio_mean == pytest.approx(11.5 / 3)  # (10 + 1.25 + 0.25) / 3
    assert c.stats.ratio_max == pytest.approx(10.0)
    assert c.stats.ess == pytest.approx(1.0)
    # k1 = mean(log mu - log pi_old) = (ln 0.1 + ln 0.8 + ln 4) / 3 = ln(0.32) / 3
    assert c.stats.kl_k1 == pytest.approx(LN(0.32) / 3)


def test_tis_truncates_at_cap():
    old, mu, has, mask = _example()
    c, terms, grad = _run("tis", old, old, mu, has, mask, torch.tensor([1.0]))
    # weights min(r, 2) = (2, 1.25, 0.25); loss -(2 + 1.25 + 0.25) / 3 = -3.5 / 3
    assert c.token_weight.flatten().tolist() == pytest.approx([2.0, 1.25, 0.25])
    assert c.mask.all()
    assert terms.loss.item() == pytest.approx(-3.5 / 3)
    assert grad.flatten().tolist() == pytest.approx([-2 / 3, -1.25 / 3, -0.25 / 3])
    assert c.stats.clip_frac == pytest.approx(1 / 3)  # only r = 10 exceeds C = 2
    assert c.stats.weight_mean == pytest.approx(3.5 / 3)
    assert c.stats.weight_max == pytest.approx(2.0)
    # ESS = 3.5^2 / (3 * (4 + 1.5625 + 0.0625)) = 12.25 / 16.875
    assert c.stats.ess == pytest.approx(12.25 / 16.875)
    assert tis_weight(torch.tensor([10.0, 1.25, 0.25]), cap=5.0).tolist() == [5.0, 1.25, 0.25]


def test_icepop_masks_loss_and_denominator():
    old, mu, has, mask = _example()
    c, terms, grad = _run("icepop", old, old, mu, has, mask, torch.tensor([1.0]))
    # r = 10 > beta = 5 and r = 0.25 < alpha = 0.5 are dropped; r = 1.25 kept with weight 1.25
    assert c.mask.tolist() == [[False, True, False]]
    assert c.tokens == 1  # the caller's total_tokens
    assert c.token_weight.flatten().tolist() == pytest.approx([0.0, 1.25, 0.0])
    # -(1.25 * 1) / 1: the denominator is the kept count, not 3
    assert terms.loss.item() == pytest.approx(-1.25)
    assert terms.tokens == 1
    assert grad.flatten().tolist() == pytest.approx([0.0, -1.25, 0.0])
    assert c.stats.mask_frac == pytest.approx(2 / 3)
    assert c.stats.kept_tokens == 1.0
    assert c.stats.ess == pytest.approx(1.0)
    # bounds are inclusive
    assert icepop_keep(torch.tensor([0.5, 5.0, 0.49, 5.01])).tolist() == [True, True, False, False]


def test_remix_centres_window_on_old_over_behaviour():
    old, mu, has, mask = _example()
    c, terms, grad = _run("remix", old, old, mu, has, mask, torch.tensor([1.0]))
    # at theta = theta_old, r = pi_theta / mu = w = (10, 1.25, 0.25): inside [w - 0.2, w + 0.28]
    # loss -(10 + 1.25 + 0.25) / 3 = -11.5 / 3, gradient -A * r / 3 per token
    assert c.token_weight is None and c.mask.all()
    assert terms.loss.item() == pytest.approx(-11.5 / 3)
    assert grad.flatten().tolist() == pytest.approx([-10 / 3, -1.25 / 3, -0.25 / 3])
    assert (terms.clipped_low, terms.clipped_high) == (0, 0)
    assert c.stats.weight_max == pytest.approx(10.0)


def test_luffy_shapes_tokens_without_behaviour_only():
    # 2x2: row 0 = own data with behaviour log-probs, p = (0.5, 0.5), A = +1;
    #      row 1 = peer on another tokenizer (no behaviour), p = (0.1, 0.4), A = -1; gamma = 0.1.
    logp = torch.tensor([[LN(0.5), LN(0.5)], [LN(0.1), LN(0.4)]], dtype=torch.float64)
    has = torch.tensor([[True, True], [False, False]])
    mu = torch.where(has, logp, torch.zeros_like(logp))
    mask = torch.ones(2, 2, dtype=torch.bool)
    c, terms, grad = _run("luffy", logp, logp, mu, has, mask, torch.tensor([1.0, -1.0]))
    assert c.shaped.tolist() == [[False, False], [True, True]]
    # row 0: ratio 1 -> -1 -1 = -2. row 1: -A f(p) = f(0.1) + f(0.4) = 0.1/0.2 + 0.4/0.5 = 0.5 + 0.8 = 1.3
    # loss (-2 + 1.3) / 4 = -0.175
    assert terms.loss.item() == pytest.approx(-0.175)
    assert terms.tokens == 4
    # grads: row 0 -1/4; row 1 -A * p*g/(p+g)^2 / 4:
    #   0.1*0.1/0.04 = 0.25 -> 0.0625; 0.4*0.1/0.25 = 0.16 -> 0.04
    assert grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.0625, 0.04])
    # diagnostics: effective weights (1, 1, 0.25, 0.16); ESS = 2.41^2 / (4 * 2.0881)
    assert c.stats.weight_max == pytest.approx(1.0)
    assert c.stats.behaviour_frac == pytest.approx(0.5)
    assert c.stats.ess == pytest.approx(2.41**2 / (4 * 2.0881))


def test_icepop_denominator_across_microbatches():
    # 2x2 batch split into two 1x2 micro-batches: total_tokens is the sum of the kept counts, and the
    # micro-batch losses add up to the full-batch loss (as grpo.policy_loss promises).
    # ratios pi_old / mu: row 0 (1, 8) -> keep 1 token; row 1 (2, 0.6) -> keep both; total_tokens = 3
    old = torch.tensor([[LN(0.5), LN(0.8)], [LN(0.4), LN(0.12)]], dtype=torch.float64)
    mu = torch.tensor([[LN(0.5), LN(0.1)], [LN(0.2), LN(0.2)]], dtype=torch.float64)
    ones = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    full = correction_for("icepop", old_logp=old, behaviour_logp=mu, has_behaviour=ones, mask=ones)
    parts = [
        correction_for(
            "icepop",
            old_logp=old[i : i + 1],
            behaviour_logp=mu[i : i + 1],
            has_behaviour=ones[i : i + 1],
            mask=ones[i : i + 1],
        )
        for i in range(2)
    ]
    total = sum(p.tokens for p in parts)
    assert total == full.tokens == 3
    whole = corrected_loss(full, old, old, adv, total_tokens=total, **CLIP).loss.item()
    split = sum(
        corrected_loss(
            p, old[i : i + 1], old[i : i + 1], adv[i : i + 1], total_tokens=total, **CLIP
        ).loss.item()
        for i, p in enumerate(parts)
    )
    # row 0: -(A=1 * w=1) = -1; row 1 (A = -1): 2 + 0.6 = 2.6; (-1 + 2.6) / 3 kept tokens
    assert whole == pytest.approx(1.6 / 3)
    assert split == pytest.approx(whole)


# ------------------------------------------------------------------------------------------------
# Gradients of tiny cases, pi_theta != pi_old (a later update of the round)


def test_tis_gradient_hand_derived():
    # pi_theta = 0.6, pi_old = 0.5, mu = 0.2: r_ppo = 1.2 (inside [0.8, 1.28]), weight min(2.5, 2) = 2
    # loss = -A * w * r_ppo = -2.4 for A = 1; d/dlogp (r_ppo) = r_ppo -> gradient -A * w * r_ppo = -2.4
    one = torch.ones(1, 1, dtype=torch.bool)
    c, terms, grad = _run("tis", _logp(0.6), _logp(0.5), _logp(0.2), one, one, torch.tensor([1.0]))
    assert terms.loss.item() == pytest.approx(-2.4)
    assert grad.item() == pytest.approx(-2.4)


def test_icepop_gradient_hand_derived():
    # tokens: pi_theta = (0.6, 0.6), pi_old = (0.5, 0.5), mu = (0.25, 0.05): r = (2, 10) -> second dropped
    # A = -1: first token loss = -(min(1.2 * -1, clip(1.2) * -1)) * 2 = 1.2 * 2 = 2.4 (unclipped: 1.2 < 1.28)
    # denominator 1; gradient = -A * w * r_ppo = 2.4 on the kept token, 0 on the dropped one
    ones = torch.ones(1, 2, dtype=torch.bool)
    c, terms, grad = _run(
        "icepop", _logp(0.6, 0.6), _logp(0.5, 0.5), _logp(0.25, 0.05), ones, ones, torch.tensor([-1.0])
    )
    assert c.tokens == 1
    assert terms.loss.item() == pytest.approx(2.4)
    assert grad.flatten().tolist() == pytest.approx([2.4, 0.0])


def test_remix_gradient_and_additive_window():
    # mu = 0.25, pi_old = 0.5 -> w = 2, window [1.8, 2.28]
    # token 1: pi_theta = 0.6 -> r = 2.4 > 2.28. token 2: pi_theta = 0.55 -> r = 2.2 inside.
    ones = torch.ones(1, 2, dtype=torch.bool)
    old, mu = _logp(0.5, 0.5), _logp(0.25, 0.25)
    # A = +1: token 1 min(2.4, 2.28) = 2.28 clipped, no gradient; token 2 -2.2, gradient -r = -2.2
    c, terms, grad = _run("remix", _logp(0.6, 0.55), old, mu, ones, ones, torch.tensor([1.0]))
    assert terms.loss.item() == pytest.approx(-(2.28 + 2.2) / 2)
    assert grad.flatten().tolist() == pytest.approx([0.0, -1.1])
    assert (terms.clipped_low, terms.clipped_high) == (0, 1)
    # A = -1: min(-2.4, -2.28) = -2.4 unclipped; loss (2.4 + 2.2) / 2, gradient -A * r / 2
    c, terms, grad = _run("remix", _logp(0.6, 0.55), old, mu, ones, ones, torch.tensor([-1.0]))
    assert terms.loss.item() == pytest.approx((2.4 + 2.2) / 2)
    assert grad.flatten().tolist() == pytest.approx([1.2, 1.1])
    # a multiplicative window w * [0.8, 1.28] = [1.6, 2.56] would have left r = 2.4 unclipped:
    # the window is additive (GePPO), so with A = +1 token 1 is clipped above
    terms = remix_policy_loss(
        _logp(0.6), _logp(0.5), _logp(0.25), torch.tensor([1.0]), torch.ones(1, 1), total_tokens=1, **CLIP
    )
    assert terms.loss.item() == pytest.approx(-2.28)


def test_luffy_gradient_hand_derived():
    # f(p) = p / (p + 0.1); d f / d log p = 0.1 p / (p + 0.1)^2
    # p = 0.3: f = 0.75, gradient -A * 0.03 / 0.16 = -0.1875 (A = 1)
    leaf = _logp(0.3, grad=True)
    terms = luffy_policy_loss(leaf, torch.tensor([1.0]), torch.ones(1, 1), gamma=0.1, total_tokens=1)
    terms.loss.backward()
    assert terms.loss.item() == pytest.approx(-0.75)
    assert leaf.grad.item() == pytest.approx(-0.1875)
    assert luffy_token_weight(_logp(0.3)).item() == pytest.approx(0.1875)
    # the shaping is weakest on confident tokens and strongest at p = gamma (1/4)
    assert luffy_token_weight(_logp(0.1)).item() == pytest.approx(0.25)
    assert luffy_token_weight(_logp(0.9)).item() == pytest.approx(0.09)  # 0.09 / 1.0


# ------------------------------------------------------------------------------------------------
# On-policy data: every mode is plain GRPO


@pytest.mark.parametrize("mode", MODES)
def test_on_policy_every_mode_is_plain_grpo(mode):
    """mu == pi_old == pi_theta (detached): loss and gradient equal grpo.policy_loss without corrections.

    On on-policy data every importance ratio pi_old / mu is 1: tis weights min(1, C) = 1, icepop keeps
    every token (1 is in [0.5, 5]) with weight 1, remix's window centre w = 1 gives the DAPO window.
    luffy: on-policy data carries behaviour log-probs, and luffy shapes only tokens *without* them (a peer
    on another tokenizer, where neither pi_old/mu nor "on-policy" can be stated); its behaviour tokens get
    ratio 1, so it too is plain GRPO here. The shaping term itself is not GRPO for any p; what it equals
    is checked in ``test_luffy_equals_grpo_with_shaping_weight``.
    """
    probs = torch.tensor([[0.3, 0.6, 0.9], [0.05, 0.5, 0.7]], dtype=torch.float64)
    base = probs.log()
    mask = torch.tensor([[True, True, True], [False, True, True]])  # one padding token
    adv = torch.tensor([0.8, -1.3], dtype=torch.float64)
    ref = base.detach().clone().requires_grad_(True)
    expected = policy_loss(ref, base, adv, mask, total_tokens=5, **CLIP)
    expected.loss.backward()

    c, terms, grad = _run(mode, base, base, base, torch.ones_like(mask), mask, adv)
    assert c.tokens == 5
    assert terms.loss.item() == pytest.approx(expected.loss.item(), abs=1e-12)
    assert torch.allclose(grad, ref.grad, atol=1e-12)
    assert terms.tokens == expected.tokens
    assert c.stats.ess == pytest.approx(1.0)
    assert c.stats.kl_k1 == pytest.approx(0.0)


def test_luffy_equals_grpo_with_shaping_weight():
    """LUFFY's term has GRPO's gradient re-weighted per token by d f / d log p = p g / (p + g)^2.

    At ratio 1 (pi_theta == pi_old), grpo.policy_loss's gradient is -A * token_weight / N per token, so
    token_weight = luffy_token_weight(logp) reproduces LUFFY's gradient exactly (loss values differ: LUFFY's
    is -A f(p), GRPO's -A * weight).
    """
    logp = torch.tensor([[LN(0.3), LN(0.05)], [LN(0.9), LN(0.5)]], dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    mask = torch.ones(2, 2)
    a = logp.clone().requires_grad_(True)
    luffy_policy_loss(a, adv, mask, total_tokens=4).loss.backward()
    b = logp.clone().requires_grad_(True)
    policy_loss(
        b, logp, adv, mask, total_tokens=4, token_weight=luffy_token_weight(logp), **CLIP
    ).loss.backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-12)


def test_tokens_without_behaviour_are_plain_grpo():
    # tis/icepop/remix on a row with no behaviour log-probs (mu := pi_old, ratio 1): same as mode none
    old = _logp(0.5, 0.2)
    logp = _logp(0.55, 0.21)
    has = torch.zeros(1, 2, dtype=torch.bool)
    junk = torch.tensor([[-50.0, float("nan")]], dtype=torch.float64)  # ignored where has_behaviour is False
    mask = torch.ones(1, 2, dtype=torch.bool)
    _, ref, ref_grad = _run("none", logp, old, junk, has, mask, torch.tensor([1.0]))
    for mode in ("tis", "icepop", "remix"):
        c, terms, grad = _run(mode, logp, old, junk, has, mask, torch.tensor([1.0]))
        assert terms.loss.item() == pytest.approx(ref.loss.item())
        assert torch.allclose(grad, ref_grad)
        assert c.stats.behaviour_frac == 0.0


# ------------------------------------------------------------------------------------------------
# ESS, learning-rate damping, KL-convex schedule


def test_effective_sample_size():
    mask = torch.ones(4, dtype=torch.bool)
    assert effective_sample_size(torch.full((4,), 3.0), mask) == pytest.approx(1.0)
    # one dominant weight: (1000 + 3)^2 / (4 * (1000^2 + 3)) = 1006009 / 4000012 ~ 0.2515 ~ 1/n
    assert effective_sample_size(torch.tensor([1000.0, 1, 1, 1]), mask) == pytest.approx(1006009 / 4000012)
    # masked tokens do not count: only (2, 2) remain -> 1.0
    assert effective_sample_size(torch.tensor([2.0, 2.0, 1e6]), torch.tensor([True, True, False])) == 1.0
    # (1 + 3)^2 / (2 * (1 + 9)) = 16 / 20
    assert effective_sample_size(torch.tensor([1.0, 3.0]), torch.ones(2, dtype=torch.bool)) == pytest.approx(
        0.8
    )
    assert effective_sample_size(torch.tensor([1.0]), torch.zeros(1, dtype=torch.bool)) == 1.0


def test_ess_lr_scale():
    assert ess_lr_scale(0.25, 0.5) == pytest.approx(math.sqrt(0.5))  # sqrt(0.25 / 0.5)
    assert ess_lr_scale(0.9, 0.5) == 1.0  # min(1, 1.8) = 1
    assert ess_lr_scale(0.5, 0.5) == 1.0
    assert ess_lr_scale(0.01, 0.64) == pytest.approx(0.125)  # sqrt(1/64)
    with pytest.raises(ValueError):
        ess_lr_scale(0.5, 0.0)


@pytest.mark.parametrize(
    ("step", "coef"),
    [
        (0, 1.0),  # max(0 - 50, 0) = 0 -> ceil(0) = 0 -> 1 - 0 = 1
        (50, 1.0),  # 0 again
        (51, 0.9),  # ceil(1 / 10) = 1 -> 1 - 0.1
        (60, 0.9),  # ceil(10 / 10) = 1
        (61, 0.8),  # ceil(11 / 10) = 2 -> 1 - 0.2
        (100, 0.5),  # ceil(50 / 10) = 5 -> 1 - 0.5 = 0.5
        (1000, 0.5),  # ceil(950 / 10) = 95 -> 1 - 9.5 < 0.5 -> floor 0.5
    ],
)
def test_remix_kl_coef(step, coef):
    assert remix_kl_coef(step) == pytest.approx(coef)


# ------------------------------------------------------------------------------------------------
# Untrusted behaviour log-probs


def test_sanitize_clamps_untrusted_values():
    raw = torch.tensor([[float("nan"), float("inf"), float("-inf"), 3.0, -50.0, -1.5, -7.0]])
    has = torch.tensor([[True, True, True, True, True, True, False]])
    clean = sanitize_behaviour_logp(raw, has)
    # NaN -> floor, +inf -> 0, -inf -> floor, positive -> 0, below floor -> floor, in range kept,
    # no behaviour -> 0 (never used as mu)
    assert clean.tolist() == [[-20.0, 0.0, -20.0, 0.0, -20.0, -1.5, 0.0]]
    assert sanitize_behaviour_logp(torch.tensor([-30.0]), torch.tensor([True]), floor=-5.0).tolist() == [-5.0]


def test_untrusted_values_only_truncated_or_masked():
    # pi_old = 0.5 on every token; a peer claims mu = (NaN, +inf, 5.0, -1e9)
    # NaN is unknown (ratio 1); sanitized mu = (-, 1, 1, e^-20) -> r = pi_old / mu = (1, 0.5, 0.5, 0.5 e^20)
    old = torch.full((1, 4), LN(0.5), dtype=torch.float64)
    claimed = torch.tensor([[float("nan"), float("inf"), 5.0, -1e9]], dtype=torch.float64)
    ones = torch.ones(1, 4, dtype=torch.bool)
    tis = correction_for("tis", old_logp=old, behaviour_logp=claimed, has_behaviour=ones, mask=ones)
    assert tis.token_weight.flatten().tolist() == pytest.approx([1.0, 0.5, 0.5, 2.0])  # truncated at C
    assert tis.stats.weight_max <= 2.0
    ice = correction_for("icepop", old_logp=old, behaviour_logp=claimed, has_behaviour=ones, mask=ones)
    assert ice.mask.tolist() == [[True, True, True, False]]  # 0.5 e^20 > beta: masked out
    assert all(math.isfinite(v) for v in astuple(tis.stats))
    assert all(math.isfinite(v) for v in astuple(ice.stats))


def test_unknown_mode_and_shape_mismatch_raise():
    x = torch.zeros(1, 2)
    ones = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="unknown off-policy correction"):
        correction_for("is", old_logp=x, behaviour_logp=x, has_behaviour=ones, mask=ones)
    with pytest.raises(ValueError, match="one shape"):
        correction_for("tis", old_logp=x, behaviour_logp=torch.zeros(1, 3), has_behaviour=ones, mask=ones)
