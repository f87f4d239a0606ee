"""What training will take in memory, said at start, with what to change when the machine cannot hold it.

Running out of memory is the most common failure of volunteer training clients, and the cause is
predictable: the weights, their gradients and AdamW's two moments (4 x the trainable weights' bytes
on top of the frozen ones), plus the activations of one micro-batch, which grow with
``train.token_budget`` and shrink a lot with ``model.gradient_checkpointing``. The activation figures
per token and layer are measured on SmolLM2-135M (docs/performance.md, "Memory"), so this is an
estimate to warn by, not a bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from swarmnode.config import ModelConfig, TrainConfig

# Bytes held per token of a micro-batch, per layer and unit of hidden width (measured, docs/performance.md).
ACTIVATION_BYTES_PER_TOKEN_LAYER_WIDTH = 48.0
CHECKPOINTED_BYTES_PER_TOKEN_LAYER_WIDTH = 8.0
RUNTIME_BYTES = 700 * 2**20  # the interpreter with torch, transformers, tokenizers and reasoning-gym loaded


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int  # every parameter, trainable or not
    training_state: int  # gradients and AdamW's two moments of the trainable ones
    activations: int  # one micro-batch of train.token_budget tokens
    runtime: int = RUNTIME_BYTES

    @property
    def total(self) -> int:
        return self.weights + self.training_state + self.activations + self.runtime


def estimate(model: torch.nn.Module, model_cfg: ModelConfig, train: TrainConfig) -> MemoryEstimate:
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    trainable = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", 1)
    width = getattr(config, "hidden_size", 1)
    per = (
        CHECKPOINTED_BYTES_PER_TOKEN_LAYER_WIDTH
        if model_cfg.gradient_checkpointing
        else ACTIVATION_BYTES_PER_TOKEN_LAYER_WIDTH
    )
    activations = int(train.token_budget * layers * width * per)
    return MemoryEstimate(weights=weights, training_state=3 * trainable, activations=activations)


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def describe(est: MemoryEstimate, model_cfg: ModelConfig, train: TrainConfig, available: int | None) -> str:
    """The start-up line: the estimate, and when it exceeds what is available, what to change."""
    gib = 2**30
    line = (
        f"memory: ~{est.total / gib:.1f} GiB at peak (weights {est.weights / gib:.2f}, gradients and AdamW "
        f"{est.training_state / gib:.2f}, activations of a {train.token_budget}-token micro-batch "
        f"{est.activations / gib:.2f}, runtime {est.runtime / gib:.2f})"
    )
    if available is None:
        return line
    line += f", {available / gib:.1f} GiB available"
    if est.total > available:
        fixes = []
        if not model_cfg.gradient_checkpointing:
            fixes.append("--set model.gradient_checkpointing=true")
        fixes.append(f"--set train.token_budget={max(train.token_budget // 2, 256)}")
        if model_cfg.lora is None:
            fixes.append("LoRA (model.lora) to train fewer weights")
        line += "; MAY NOT FIT: try " + ", ".join(fixes)
    return line
