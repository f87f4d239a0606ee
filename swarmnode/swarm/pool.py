"""Verified peer groups waiting for a round: dedup by content, a capped pool, and the SAPO choice.

A group's identity is its content (``group_digest``: task and completion texts), whoever sent it, so
the same completions re-signed in a new batch are never trained on twice. The pool keeps the newest
``MAX_POOL_GROUPS``; ``select`` takes the round's J groups: zero-advantage groups dropped after local
re-scoring, freshest arrival first, uniform among equally fresh ones. Each group is trained on at most
once.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

from swarmnode.common import BoundedSet
from swarmnode.rollouts import RolloutGroup

MAX_POOL_GROUPS = 512
MAX_SEEN_GROUPS = 65536  # content digests remembered for dedup (~100 B each)


def texts_digest(group: RolloutGroup) -> str:
    """sha256 of the JSON list of the group's completion texts."""
    texts = json.dumps([c.text for c in group.completions], ensure_ascii=False)
    return hashlib.sha256(texts.encode("utf-8", "surrogatepass")).hexdigest()


def group_digest(group: RolloutGroup) -> str:
    """Identity of a group's content: its task and its completion texts, whoever sent it."""
    return hashlib.sha256(f"{group.ref.key()}\n{texts_digest(group)}".encode()).hexdigest()


@dataclass
class PooledGroup:
    group: RolloutGroup
    arrived_round: int  # our round when it arrived: the freshness tier


class GroupPool:
    """Peer groups verified and not yet trained on. ``rng`` breaks ties within a freshness tier."""

    def __init__(self, rng: random.Random):
        self.groups: list[PooledGroup] = []
        self._seen: BoundedSet[str] = BoundedSet(MAX_SEEN_GROUPS)  # group_digest()s
        self._rng = rng

    def __len__(self) -> int:
        return len(self.groups)

    def unseen(self, groups: list[RolloutGroup]) -> tuple[list[RolloutGroup], int]:
        """The groups whose task and completion texts never arrived before (from anyone), and how many
        were duplicates; the fresh ones are remembered."""
        fresh, duplicates = [], 0
        for group in groups:
            digest = group_digest(group)
            if digest in self._seen:
                duplicates += 1
                continue
            self._seen.add(digest)
            fresh.append(group)
        return fresh, duplicates

    def add(self, groups: list[RolloutGroup], round_: int) -> None:
        """Pool ``groups`` as arrived in our round ``round_``; past MAX_POOL_GROUPS the oldest go."""
        self.groups.extend(PooledGroup(g, round_) for g in groups)
        del self.groups[:-MAX_POOL_GROUPS]

    def select(self, count: int) -> list[RolloutGroup]:
        """SAPO choice: informative groups only, freshest arrival first, uniform within a tier."""
        candidates = [p for p in self.groups if p.group.informative]
        self._rng.shuffle(candidates)
        candidates.sort(key=lambda p: -p.arrived_round)  # stable: shuffled order kept within a tier
        chosen = candidates[:count]
        chosen_ids = {id(p) for p in chosen}
        self.groups = [p for p in self.groups if id(p) not in chosen_ids and p.group.informative]
        return [p.group for p in chosen]
