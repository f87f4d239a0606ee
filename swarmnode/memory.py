"""What training will take in memory, said at start, with what to change when the machine cannot hold it;
and whether activation checkpointing pays (``model.gradient_checkpointing: null``, the default).

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

# Bytes held for the backward pass per token of a micro-batch, per layer and unit of hidden width, fp32
# (docs/performance.md, "Memory"): a llama-style layer saves ~10 hidden-width and ~4 MLP-width vectors
# per token; checkpointed, only its input, plus one layer's worth while it is recomputed.
ACTIVATION_BYTES_PER_TOKEN_LAYER_WIDTH = 84.0
CHECKPOINTED_BYTES_PER_TOKEN_LAYER_WIDTH = 8.0
CHECKPOINTING_FROM_BYTES = 2**30  # auto: checkpoint on the CPU once one micro-batch's activations pass this
RUNTIME_BYTES = 700 * 2**20  # the interpreter with torch, transformers, tokenizers and reasoning-gym loaded


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int  # every parameter, trainable or not
    training_state: int  # gradients and AdamW's two moments of the trainable ones
    activations: int  # one micro-batch of train.token_budget tokens
    checkpointed: bool = False  # activations recomputed in the backward pass
    runtime: int = RUNTIME_BYTES
    frozen: int = 0  # frozen copies of the weights: the drift gate's base model, the KL reference

    @property
    def total(self) -> int:
        return self.weights + self.training_state + self.activations + self.runtime + self.frozen


def _activation_bytes(model: torch.nn.Module, train: TrainConfig, checkpointed: bool) -> int:
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", 1)
    width = getattr(config, "hidden_size", 1)
    per = CHECKPOINTED_BYTES_PER_TOKEN_LAYER_WIDTH if checkpointed else ACTIVATION_BYTES_PER_TOKEN_LAYER_WIDTH
    return int(train.token_budget * layers * width * per)


def checkpointing_pays(
    model: torch.nn.Module, device: torch.device, train: TrainConfig, available: int | None
) -> bool:
    """The auto rule: on the CPU (memory shared with the rest of the machine, and a laptop's is small),
    checkpoint when one micro-batch's activations would pass 1 GiB or a quarter of what is available."""
    if device.type != "cpu":
        return False
    limit = min(CHECKPOINTING_FROM_BYTES, available // 4) if available else CHECKPOINTING_FROM_BYTES
    return _activation_bytes(model, train, checkpointed=False) > limit


def estimate(model: torch.nn.Module, train: TrainConfig, frozen_copies: int = 0) -> MemoryEstimate:
    """Peak bytes of a training step, with ``frozen_copies`` frozen copies of the weights beside it;
    whether activations are checkpointed is read from the model."""
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    trainable = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    checkpointed = bool(getattr(model, "is_activation_checkpointing", False))
    activations = _activation_bytes(model, train, checkpointed)
    return MemoryEstimate(
        weights, 3 * trainable, activations, checkpointed=checkpointed, frozen=frozen_copies * weights
    )


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
        f"{est.activations / gib:.2f}{' (checkpointed)' if est.checkpointed else ''}, "
        f"{f'frozen copies {est.frozen / gib:.2f}, ' if est.frozen else ''}runtime {est.runtime / gib:.2f})"
    )
    if available is None:
        return line
    line += f", {available / gib:.1f} GiB available"
    if est.total > available:
        fixes = []
        if not est.checkpointed:
            fixes.append("--set model.gradient_checkpointing=true")
        fixes.append(f"--set train.token_budget={max(train.token_budget // 2, 256)}")
        if model_cfg.lora is None:
            fixes.append("LoRA (model.lora) to train fewer weights")
        if est.frozen:
            fixes.append("a peer defence without a base model (--set offpolicy.peer_defence=span_multiscale)")
        line += "; MAY NOT FIT: try " + ", ".join(fixes)
    return line
