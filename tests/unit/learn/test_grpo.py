"""GRPO/DAPO loss against hand-computed values."""

import math

import pytest
import torch

from swarmnode.learn.grpo import group_advantages, kl_penalty, policy_loss

CLIP = {"clip_low": 0.2, "clip_high": 0.28}


def _loss(ratio: float, adv: float, **kw):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    old = torch.zeros(1, 1)
    terms = policy_loss(logp, old, torch.tensor([adv]), torch.ones(1, 1), total_tokens=1, **CLIP, **kw)
    terms.loss.backward()
    return terms, logp.grad.item()


def test_group_advantages_hand_values():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    # mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866
    assert adv.tolist() == pytest.approx([0.8660, -0.8660, -0.8660, 0.8660], abs=1e-3)
    assert group_advantages(torch.tensor([1.0, 0.0]), scale=False).tolist() == [0.5, -0.5]
    assert group_advantages(torch.tensor([0.3, 0.3, 0.3])).abs().max().item() == 0.0


@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "grad", "low", "high"),
    [
        (1.5, 1.0, -1.28, 0.0, 0, 1),  # above 1 + clip_high with A > 0: clipped, no gradient
        (0.5, -1.0, 0.8, 0.0, 1, 0),  # below 1 - clip_low with A < 0: clipped, no gradient
        (0.5, 1.0, -0.5, -0.5, 0, 0),  # A > 0 and ratio low: the unclipped term is the min
        (1.5, -1.0, 1.5, 1.5, 0, 0),  # A < 0 and ratio high: unclipped, gradient -A * ratio
        (1.2, 1.0, -1.2, -1.2, 0, 0),  # inside the asymmetric window (1.2 < 1.28)
    ],
)
def test_clipping_both_sides(ratio, adv, loss, grad, low, high):
    terms, g = _loss(ratio, adv)
    assert terms.loss.item() == pytest.approx(loss, abs=1e-6)
    assert g == pytest.approx(grad, abs=1e-6)
    assert (terms.clipped_low, terms.clipped_high) == (low, high)


def test_padding_mask_excludes_tokens():
    logp = torch.tensor([[0.0, 5.0], [0.0, -7.0]])  # the second column is padding with wild values
    mask = torch.tensor([[1, 0], [1, 0]])
    terms = policy_loss(logp, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), mask, total_tokens=2, **CLIP)
    # ratio 1 on both real tokens: (-1 + 1) / 2 = 0
    assert terms.loss.item() == pytest.approx(0.0)
    assert terms.tokens == 2


def test_token_level_aggregation_and_microbatch_equivalence():
    # seq A: 1 token, A=+1; seq B: 3 tokens, A=-1; on-policy ratio 1.
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[0, 0, 1], [1, 1, 1]])
    adv = torch.tensor([1.0, -1.0])
    full = policy_loss(logp, logp, adv, mask, total_tokens=4, **CLIP).loss.item()
    # token mean: (-1*1 + 1*3) / 4 = 0.5 (a per-sequence mean would give (-1 + 1)/2 = 0)
    assert full == pytest.approx(0.5)
    parts = sum(
        policy_loss(
            logp[i : i + 1], logp[i : i + 1], adv[i : i + 1], mask[i : i + 1], total_tokens=4, **CLIP
        ).loss.item()
        for i in range(2)
    )
    assert parts == pytest.approx(full)


def test_kl_term_k3():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    terms = policy_loss(
        logp, logp, torch.tensor([0.0]), torch.ones(1, 1), total_tokens=1, ref_logp=ref, kl_beta=0.1, **CLIP
    )
    kl = 0.5 - math.log(0.5) - 1  # exp(log r) - log r - 1 with r = 0.25 / 0.5
    assert terms.kl_sum == pytest.approx(kl, abs=1e-6)
    assert terms.loss.item() == pytest.approx(0.1 * kl, abs=1e-6)
    off = policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), total_tokens=1, ref_logp=ref, **CLIP)
    assert off.loss.item() == 0.0


def test_token_weight_scales_policy_term():
    terms, g = _loss(1.0, 1.0, token_weight=torch.tensor([[0.5]]))
    assert terms.loss.item() == pytest.approx(-0.5)
    assert g == pytest.approx(-0.5)


def test_kl_penalty_by_hand():
    # k3 at pi = 0.5, ref = 0.25: exp(log 0.5) - log 0.5 - 1 = 0.5 + 0.6931 - 1 = 0.1931; the masked-out
    # token (pi = 0.1, ref = 0.9) does not count
    logp = torch.log(torch.tensor([[0.5, 0.1]], requires_grad=True))
    ref = torch.log(torch.tensor([[0.25, 0.9]]))
    mask = torch.tensor([[1, 0]])
    loss, kl_sum = kl_penalty(logp, ref, mask, kl_beta=2.0, total_tokens=4)
    k3 = 0.5 + math.log(2.0) - 1.0
    assert kl_sum == pytest.approx(k3, rel=1e-6)
    assert loss.item() == pytest.approx(2.0 * k3 / 4, rel=1e-6)
    assert kl_penalty(logp, ref, mask, kl_beta=0.0, total_tokens=4)[1] == 0.0
