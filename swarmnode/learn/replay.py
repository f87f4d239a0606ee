"""Bounded replay of this node's own recent rollout groups (experience reuse, ReMix-style).

Groups are kept with the policy version that sampled them; a replayed group is stale by
``learner version - policy_version`` updates and reaches the learner as local data with its original
behaviour log-probs, so the ``offpolicy.local`` correction (tis / icepop / remix) accounts for the gap.
Groups staler than ``max_staleness`` are dropped and counted, never replayed. The buffer is not
checkpointed: a restarted node starts with an empty one.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

from swarmnode.rollouts import RolloutGroup


class ReplayBuffer:
    def __init__(self, capacity: int, max_staleness: int, seed: int = 0):
        self.max_staleness = max_staleness
        self._groups: deque[RolloutGroup] = deque(maxlen=capacity)
        self._rng = random.Random(seed)
        self.dropped_stale = 0

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, groups: Sequence[RolloutGroup]) -> None:
        """Keep the informative ones (a zero-advantage group teaches nothing, now or later)."""
        self._groups.extend(g for g in groups if g.informative)

    def sample(self, count: int, learner_version: int) -> list[RolloutGroup]:
        """Up to ``count`` groups, uniformly among those within the staleness cap; each is replayed once."""
        fresh = [
            g for g in self._groups if learner_version - g.provenance.policy_version <= self.max_staleness
        ]
        self.dropped_stale += len(self._groups) - len(fresh)
        chosen = self._rng.sample(fresh, min(count, len(fresh)))
        chosen_ids = {id(g) for g in chosen}
        self._groups = deque((g for g in fresh if id(g) not in chosen_ids), maxlen=self._groups.maxlen)
        return chosen
