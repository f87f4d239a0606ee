"""The sampler interface every backend implements, and the choice of backend."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence

from swarmnode.config import SamplingConfig
from swarmnode.rollouts import Completion


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


class Sampler(ABC):
    """Generates completions from the current policy.

    Backends return the same structures: per prompt, ``n`` ``Completion``s whose ``token_ids`` are the
    sampled ids (EOS included when the completion finished) and ``logprobs`` the behaviour log-probs
    of those ids at the sampling temperature.
    """

    name: str

    @abstractmethod
    def sample(
        self, prompts: Sequence[Sequence[int]], n: int, *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[Completion]]: ...

    def sync_weights(self) -> float:
        """Make the engine sample from the trainer's current weights; returns seconds spent."""
        return 0.0


def make_sampler(cfg: SamplingConfig, policy, *, seed: int = 0, log=_stderr) -> Sampler:
    """Build the configured backend: ``vllm`` (or ``auto``) where vLLM is installed and supports the
    policy, else transformers. A wanted vLLM that cannot run is reported once, here, with the reason."""
    from swarmnode.sampler.hf import HFSampler

    if cfg.backend != "hf":
        from swarmnode.sampler import vllm

        reason = vllm.unavailable(policy.model)
        if reason is None:
            return vllm.VLLMSampler(policy.model, policy.tokenizer, cfg, seed=seed)
        log(f"sampling.backend={cfg.backend}: {reason}; sampling with transformers")
    return HFSampler(policy.model, policy.tokenizer)
