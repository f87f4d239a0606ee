"""The sampler interface every backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from swarmnode.rollouts import Completion


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
