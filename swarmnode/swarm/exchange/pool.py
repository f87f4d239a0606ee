"""Verified peer groups waiting for a round: dedup by content, a capped pool, and the SAPO choice.

A group's identity is its content (``group_digest``: task and completion texts), whoever sent it, so
the same completions re-signed in a new batch are never trained on twice. The pool keeps the newest
``MAX_POOL_GROUPS``, at most ``MAX_POOL_GROUPS_PER_PRODUCER`` of them from one producer (so one peer
cannot flood the others' groups out); ``can_fill`` tells a round whether it has enough fresh groups to
stop waiting; ``select`` takes the round's J groups: zero-advantage groups
dropped after local re-scoring, then round-robin across producers (the producer with the freshest group
first, ties at random), each producer's freshest group first, at most ``producer_cap(J)`` from one
producer. Each group is trained on at most once.

What bounds one operator's share: the cap is per producer *peer id*, and peer ids are free, so an
operator running k identities can take up to k shares, at the price of k nodes that each pass the rate
limits and verification (every group is re-scored here, and a peer's group weighs at most as much as a
local one: ``learn.batch``). Nothing here bounds Sybils beyond that; the local groups, which a peer
never displaces, are the floor of every round.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections import Counter
from dataclasses import dataclass

from swarmnode.common import BoundedSet
from swarmnode.rollouts import RolloutGroup

MAX_POOL_GROUPS = 512
MAX_POOL_GROUPS_PER_PRODUCER = 64  # one producer's groups held at once (its oldest go first)
PRODUCER_SHARE = 0.5  # the largest share of a round's J peer groups one producer may supply
MAX_SEEN_GROUPS = 65536  # content digests remembered for dedup (~100 B each)


def texts_digest(group: RolloutGroup) -> str:
    """sha256 of the JSON list of the group's completion texts."""
    texts = json.dumps([c.text for c in group.completions], ensure_ascii=False)
    return hashlib.sha256(texts.encode("utf-8", "surrogatepass")).hexdigest()


def group_digest(group: RolloutGroup) -> str:
    """Identity of a group's content: its task and its completion texts, whoever sent it."""
    return hashlib.sha256(f"{group.ref.key()}\n{texts_digest(group)}".encode()).hexdigest()


def producer_cap(count: int) -> int:
    """How many of a round's ``count`` peer groups one producer may supply: ceil(count x PRODUCER_SHARE)."""
    return max(1, math.ceil(count * PRODUCER_SHARE))


@dataclass
class PooledGroup:
    group: RolloutGroup
    arrived_round: int  # our round when it arrived: the freshness tier


class GroupPool:
    """Peer groups verified and not yet trained on. ``rng`` breaks ties (default: seeded from
    os.urandom, so nobody can predict this node's choice from its public peer id)."""

    def __init__(self, rng: random.Random | None = None):
        self.groups: list[PooledGroup] = []
        self._seen: BoundedSet[str] = BoundedSet(MAX_SEEN_GROUPS)  # group_digest()s
        self._rng = rng or random.Random(os.urandom(16))

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
        """Pool ``groups`` as arrived in our round ``round_``; past MAX_POOL_GROUPS_PER_PRODUCER of one
        producer, or MAX_POOL_GROUPS in all, the oldest go."""
        self.groups.extend(PooledGroup(g, round_) for g in groups)
        held: Counter[str] = Counter()
        kept = []
        for pooled in reversed(self.groups):  # newest first
            producer = pooled.group.provenance.producer
            held[producer] += 1
            if held[producer] <= MAX_POOL_GROUPS_PER_PRODUCER:
                kept.append(pooled)
        self.groups = kept[:MAX_POOL_GROUPS][::-1]

    def can_fill(self, count: int, since_round: int) -> bool:
        """Whether the pool holds ``count`` informative groups that arrived in our round ``since_round`` or
        later, counting at most ``producer_cap(count)`` per producer (all ``select`` takes from one): then a
        round need not wait for more."""
        fresh = Counter(
            p.group.provenance.producer
            for p in self.groups
            if p.group.informative and p.arrived_round >= since_round
        )
        return sum(min(n, producer_cap(count)) for n in fresh.values()) >= count

    def select(self, count: int) -> list[RolloutGroup]:
        """SAPO choice, capped per producer: informative groups only, round-robin across producers
        (freshest producer first), each producer's freshest group first, ties at random, at most
        ``producer_cap(count)`` groups from one producer."""
        candidates = [p for p in self.groups if p.group.informative]
        self._rng.shuffle(candidates)
        candidates.sort(key=lambda p: -p.arrived_round)  # stable: shuffled order kept within a tier
        queues: dict[str, list[PooledGroup]] = {}  # producer -> its groups, freshest first
        for pooled in candidates:
            queues.setdefault(pooled.group.provenance.producer, []).append(pooled)
        chosen: list[PooledGroup] = []
        for turn in range(producer_cap(count)):  # producers in order of their freshest group
            for queue in queues.values():
                if turn < len(queue) and len(chosen) < count:
                    chosen.append(queue[turn])
        chosen_ids = {id(p) for p in chosen}
        self.groups = [p for p in self.groups if id(p) not in chosen_ids and p.group.informative]
        return [p.group for p in chosen]
