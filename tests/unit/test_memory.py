"""The start-up memory line: what training takes, and what to change when the machine cannot hold it."""

from __future__ import annotations

from swarmnode import memory
from swarmnode.config import ModelConfig, TinyModelConfig, TrainConfig
from swarmnode.policy import load_policy

TINY = ModelConfig(name="tiny", tiny=TinyModelConfig(family="llama"))


def test_training_state_is_three_times_the_trainable_weights_and_checkpointing_shrinks_activations():
    model = load_policy(TINY).model
    train = TrainConfig()
    est = memory.estimate(model, TINY, train)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert est.weights == weights and est.training_state == 3 * weights
    checkpointed = memory.estimate(model, TINY.model_copy(update={"gradient_checkpointing": True}), train)
    assert checkpointed.activations < est.activations
    half = memory.estimate(model, TINY, train.model_copy(update={"token_budget": train.token_budget // 2}))
    assert half.activations * 2 == est.activations


def test_the_line_says_what_to_change_only_when_it_may_not_fit():
    est = memory.MemoryEstimate(weights=2**30, training_state=3 * 2**30, activations=2**30, runtime=2**29)
    train = TrainConfig(token_budget=4096)
    roomy = memory.describe(est, TINY, train, available=64 * 2**30)
    assert "GiB at peak" in roomy and "MAY NOT FIT" not in roomy
    tight = memory.describe(est, TINY, train, available=4 * 2**30)
    assert "MAY NOT FIT" in tight
    assert "model.gradient_checkpointing=true" in tight and "train.token_budget=2048" in tight
    assert memory.available_bytes() is None or memory.available_bytes() > 0
