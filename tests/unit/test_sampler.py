"""The sampler's behaviour log-probs are the learner's log-probs of the same tokens (on-policy ratio 1)."""

import pytest
import torch

from swarmnode.config import ModelConfig, SamplingConfig, TinyModelConfig
from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.logprobs import completion_logprobs
from swarmnode.policy import load_policy
from swarmnode.prompts import encode_prompt
from swarmnode.sampler import make_sampler
from swarmnode.sampler.hf import HFSampler
from swarmnode.sampler.vllm import unavailable


@pytest.mark.parametrize(("family", "temperature"), [("llama", 1.0), ("qwen2", 0.7)])
def test_behaviour_logprobs_match_learner(family, temperature):
    policy = load_policy(ModelConfig(name="tiny", tiny=TinyModelConfig(family=family)))
    sampler = HFSampler(policy.model, policy.tokenizer)
    prompts = [encode_prompt(policy.tokenizer, q) for q in ("What is 2 + 3?", "Is p or not p true?")]
    groups = sampler.sample(prompts, 3, max_new_tokens=12, temperature=temperature, seed=7)
    assert [len(g) for g in groups] == [3, 3]
    sequences = []
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            assert c.finished == (c.token_ids[-1] == policy.tokenizer.eos_token_id)
            assert c.text == policy.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            sequences.append(TrainSequence(tuple(prompt), c.token_ids, 0.0, c.logprobs, None))
    batch = pad_batch(sequences, policy.tokenizer.pad_token_id, policy.device)
    with torch.no_grad():
        learner = completion_logprobs(policy.model, batch, temperature)
    mask = batch.completion_mask
    assert torch.allclose(learner[mask], batch.behaviour_logp[mask], atol=1e-4)
    # and a different temperature would not match: the check is sensitive
    with torch.no_grad():
        other = completion_logprobs(policy.model, batch, temperature * 2)
    assert not torch.allclose(other[mask], batch.behaviour_logp[mask], atol=1e-2)


def test_same_seed_same_samples():
    policy = load_policy(ModelConfig(name="tiny"))
    sampler = HFSampler(policy.model, policy.tokenizer)
    prompt = [encode_prompt(policy.tokenizer, "What is 1 + 1?")]
    first = sampler.sample(prompt, 4, max_new_tokens=8, temperature=1.0, seed=3)
    again = sampler.sample(prompt, 4, max_new_tokens=8, temperature=1.0, seed=3)
    other = sampler.sample(prompt, 4, max_new_tokens=8, temperature=1.0, seed=4)
    assert first == again
    assert first != other


def test_a_backend_that_cannot_run_falls_back_to_transformers_and_says_why_once():
    """Without vLLM (or with vLLM but a model it has no kernels for, as the tiny one on CPU) the node
    samples with transformers and logs one line that says why."""
    policy = load_policy(ModelConfig(name="tiny"))
    for backend in ("vllm", "auto"):
        messages: list[str] = []
        sampler = make_sampler(SamplingConfig(backend=backend), policy, log=messages.append)
        assert isinstance(sampler, HFSampler)
        assert len(messages) == 1 and messages[0].startswith(f"sampling.backend={backend}: ")
        assert messages[0].endswith("; sampling with transformers")
        assert unavailable(policy.model) in messages[0]
    messages = []
    assert isinstance(make_sampler(SamplingConfig(backend="hf"), policy, log=messages.append), HFSampler)
    assert messages == []
    assert sampler.sync_weights() == 0.0  # shares the trainer's model: nothing to copy


def test_vllm_engine_caches_the_shared_prompt_prefix_unless_told_not_to():
    from swarmnode.sampler.vllm import engine_args

    args = engine_args(SamplingConfig(), "/tmp/folder", torch.float32, seed=3)
    assert args["enable_prefix_caching"] is True and args["load_format"] == "dummy" and args["seed"] == 3
    off = engine_args(SamplingConfig(vllm_prefix_caching=False), "/tmp/folder", torch.float32, seed=3)
    assert off["enable_prefix_caching"] is False
