"""sampling.lag_rounds (sampler/lagging.py): a node that samples with the weights of k rounds ago, the stale
peer of #47's E3. Its behaviour log-probs must be those older weights', or the off-policy correction it
exists to test would be fed the wrong numbers."""

from __future__ import annotations

import torch

from swarmnode.config import ModelConfig, SamplingConfig
from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.logprobs import completion_logprobs
from swarmnode.policy import load_policy
from swarmnode.prompts import encode_prompt
from swarmnode.sampler import make_sampler
from swarmnode.sampler.lagging import LaggingSampler

LAG = 2


def _logprobs(model, prompt, ids) -> torch.Tensor:
    batch = pad_batch([TrainSequence(prompt, ids, 0.0, None, None)], 0, torch.device("cpu"))  # type: ignore[arg-type]
    with torch.no_grad():
        return completion_logprobs(model, batch, 1.0)[batch.completion_mask]


def test_a_lagging_sampler_samples_with_the_weights_of_lag_rounds_ago():
    policy = load_policy(ModelConfig(name="tiny"), seed=0)
    sampler = make_sampler(SamplingConfig(lag_rounds=LAG), policy)
    assert isinstance(sampler, LaggingSampler)
    prompt = tuple(encode_prompt(policy.tokenizer, "What is 2 + 3?"))
    states = [{k: v.clone() for k, v in policy.model.state_dict().items()}]  # the weights after each round
    for _ in range(4):  # rounds: an "update" of the learner's weights, then the round's sync
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        states.append({k: v.clone() for k, v in policy.model.state_dict().items()})
        sampler.sync_weights()
    # after round 4 the next round samples with the weights of round 4 - LAG
    [[completion]] = sampler.sample([list(prompt)], 1, max_new_tokens=12, temperature=1.0, seed=0)
    stale = load_policy(ModelConfig(name="tiny"), seed=0).model
    stale.load_state_dict(states[4 - LAG])
    expected = _logprobs(stale, prompt, completion.token_ids)
    assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)
    current = _logprobs(policy.model, prompt, completion.token_ids)
    assert not torch.allclose(torch.tensor(completion.logprobs), current, atol=1e-2)  # not the learner's
    assert len(sampler.history) == LAG  # lag + 1 copies of the weights in all, with the sampling one
