"""The tiny in-process models of both families as one fixture, ``policies``: the learner tests that
compare llama with qwen2 (log-probs, batching) share it. Registered in tests/conftest.py; the models are
imported and built only when a test asks for them, so collecting other tests does not load torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from swarmnode.policy import Policy

FAMILIES = ("llama", "qwen2")


@pytest.fixture(scope="module")
def policies() -> dict[str, Policy]:
    """A tiny llama and a tiny qwen2 (seeded random weights), by family; built once per test module."""
    from swarmnode.config import ModelConfig, TinyModelConfig
    from swarmnode.policy import load_policy

    return {
        family: load_policy(ModelConfig(name="tiny", tiny=TinyModelConfig(family=family)))
        for family in FAMILIES
    }
