"""Peers' behaviour log-probs are claims: they may lower a token's weight, never raise it above 1, and a
missing (NaN) one is neutral, not the most extreme claim."""

from __future__ import annotations

import math

import pytest
import torch

from swarmnode.learn.offpolicy import UNTRUSTED_WEIGHT_CAP, correction_for

LN = math.log


def test_nan_behaviour_logprob_is_neutral_not_the_largest_weight() -> None:
    """tis used to read NaN as mu ~ 0, the most extreme claim: weight C for trusted data too."""
    old = torch.full((1, 3), LN(0.5), dtype=torch.float64)
    claimed = torch.tensor([[float("nan"), LN(0.5), LN(0.25)]], dtype=torch.float64)
    ones = torch.ones(1, 3, dtype=torch.bool)
    tis = correction_for("tis", old_logp=old, behaviour_logp=claimed, has_behaviour=ones, mask=ones)
    assert tis.token_weight.flatten().tolist() == pytest.approx([1.0, 1.0, 2.0])
    assert tis.stats.behaviour_frac == pytest.approx(2 / 3)  # the NaN token counts as having none
    ice = correction_for("icepop", old_logp=old, behaviour_logp=claimed, has_behaviour=ones, mask=ones)
    assert ice.mask.tolist() == [[True, True, True]]


@pytest.mark.parametrize("mode", ["tis", "icepop"])
def test_untrusted_weights_never_exceed_one(mode: str) -> None:
    """A peer claiming mu = e^-20 pinned the tis weight at C = 2 for its tokens: twice a local token."""
    old = torch.full((1, 4), LN(0.5), dtype=torch.float64)
    claimed = torch.tensor([[-20.0, LN(0.25), LN(0.5), LN(0.9)]], dtype=torch.float64)
    ones = torch.ones(1, 4, dtype=torch.bool)
    c = correction_for(
        mode, old_logp=old, behaviour_logp=claimed, has_behaviour=ones, mask=ones, trusted=False
    )
    weights = c.token_weight[c.mask]
    assert float(weights.max()) <= UNTRUSTED_WEIGHT_CAP == 1.0
    assert float(weights.min()) == pytest.approx(0.5 / 0.9)  # lowering its own weight is allowed
    assert c.stats.weight_max <= 1.0
