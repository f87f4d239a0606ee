"""A sampler that runs ``sampling.lag_rounds`` rounds behind the learner: what a node whose sampling lags
its training samples (asynchronous RL, a slow machine in a fast swarm).

Why: off-policy correction (learn/offpolicy.py) is there for data sampled by weights other than the
learner's, and in a swarm of nodes at nearly the same version its importance weights stay near 1 (E1, E2 in
docs/sharing.md). A node that samples with older weights publishes groups whose behaviour log-probs are
those older weights', and trains on its own stale groups too: the case the correction must earn its place
on (E3 in docs/sharing.md). An experiment's setting, off by default.

It keeps a copy of the model for sampling and the last ``lag`` rounds' weights; after round r's update
(``sync_weights``) the copy takes the weights of round r - lag, so round r + 1 samples with weights
lag rounds older than the learner's (before that, the starting weights). Memory: lag + 1 copies of the
weights beside the learner's (counted in the start-up memory line). Sampling runs through the transformers
backend (``hf.HFSampler``) on the copy, whatever ``sampling.backend`` says.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Sequence

import torch

from swarmnode.rollouts import Completion
from swarmnode.sampler.base import Sampler
from swarmnode.sampler.hf import HFSampler


class LaggingSampler(Sampler):
    name = "hf-lagging"

    def __init__(self, model: torch.nn.Module, tokenizer, lag: int):
        if lag < 1:
            raise ValueError(f"a lagging sampler needs lag >= 1 rounds, got {lag}")
        self.source = model  # the learner's weights
        self.copy = copy.deepcopy(model).requires_grad_(False).eval()
        self.inner = HFSampler(self.copy, tokenizer)
        self.history: deque[dict[str, torch.Tensor]] = deque()  # the last ``lag`` rounds' weights
        self.lag = lag

    def sample(
        self, prompts: Sequence[Sequence[int]], n: int, *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[Completion]]:
        return self.inner.sample(
            prompts, n, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
        )

    def sync_weights(self) -> float:
        """After a round's update: the sampling copy moves to the weights of ``lag`` rounds ago."""
        start = time.perf_counter()
        if len(self.history) == self.lag:
            self.copy.load_state_dict(self.history.popleft())
        self.history.append({k: v.detach().clone() for k, v in self.source.state_dict().items()})
        return time.perf_counter() - start
