"""A tiny model with real AdamW state, and saving it as a checkpoint: shared by the checkpoint tests."""

from __future__ import annotations

from pathlib import Path

import torch

from swarmnode import checkpoint
from swarmnode.config import ModelConfig, TinyModelConfig
from swarmnode.policy import load_policy, state_digest


def trained(family: str = "llama", seed: int = 0, steps: int = 1):
    """A tiny model and an AdamW that has taken ``steps`` real steps (non-empty moments)."""
    model = load_policy(ModelConfig(name="tiny", tiny=TinyModelConfig(family=family, seed=seed))).model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.arange(3, 19).reshape(2, 8)
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=ids).logits.log_softmax(-1)[..., 5].mean().backward()
        optimizer.step()
    return model, optimizer


def save(root: Path, round_: int, model, optimizer, keep: int = 10) -> Path:
    return checkpoint.save(
        root, round_, round_ * 2, model, optimizer, state_digest(model, optimizer), keep=keep
    )
