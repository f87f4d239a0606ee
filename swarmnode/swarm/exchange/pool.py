"""Verified peer groups waiting for a round: dedup by content, a capped pool, and the SAPO choice.

A group's identity is its content (``group_digest``: task and completion texts), whoever sent it, so
the same completions re-signed in a new batch are never trained on twice. The pool keeps the newest
``MAX_POOL_GROUPS``, at most ``MAX_POOL_GROUPS_PER_PRODUCER`` of them from one producer (so one peer
cannot flood the others' groups out); ``can_fill`` tells a round whether it has enough fresh groups to
stop waiting; ``select`` takes the round's J groups: zero-advantage groups dropped after local
re-scoring, then round-robin across producers, each producer's freshest group first, at most
``producer_cap(J)`` from one producer. Each group is trained on at most once.

The order of producers is what this node measured, never what they claim (``Ranking``, the peer book): the
freshest tier first (the round a group arrived in here), then places by score (groups of theirs this node
trained on, decayed: exchange/standing.py) as seats in a proportional vote, ties at random. So identities
whose standing was bought once with a canned batch come after the peers this node keeps training on. Newcomers
score 0 and would never be chosen in a busy swarm, so one of the J goes to a producer without standing
whenever the others would all be producers with standing: the one ``Ranking.newcomers`` puts first (an origin
that holds few identities here and had no newcomer's place lately), so a flood of fresh identities from a few
networks never takes it, and each network takes it at most once in ``standing.NEWCOMER_ORIGIN_ROUNDS``. A
peer's group weighs at most as much as a local one (``learn.batch``), and the local groups, which a peer never
displaces, are the floor of every round."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

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


class Ranking(Protocol):
    """What this node measured of producers (``PeerBook``): their score, standing and which newcomers
    may take a newcomer's place now."""

    def score(self, peer_id: str) -> float: ...
    def has_standing(self, peer_id: str) -> bool: ...
    def newcomers(self, peer_ids: Iterable[str]) -> list[str]: ...
    def grant_newcomer(self, peer_id: str) -> None: ...


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

    def can_fill(
        self,
        count: int,
        since_round: int,
        rank: Callable[[str], float] = lambda _: 0.0,
        floor: float = -math.inf,
    ) -> bool:
        """Whether the pool holds ``count`` informative groups that arrived in our round ``since_round`` or
        later from producers whose ``rank`` is at least ``floor``, counting at most ``producer_cap(count)``
        per producer (all ``select`` takes from one): then a round need not wait for more."""
        fresh = Counter(
            p.group.provenance.producer
            for p in self.groups
            if p.group.informative and p.arrived_round >= since_round
        )
        return sum(min(n, producer_cap(count)) for p, n in fresh.items() if rank(p) >= floor) >= count

    def select(self, count: int, ranking: Ranking | None = None) -> list[RolloutGroup]:
        """The SAPO choice of ``count`` groups (module docstring): informative groups only, the freshest
        tier first; within it places go by ``ranking``'s score as seats in a proportional vote (D'Hondt:
        a producer's k-th group counts score / k, so a peer scored 4 has its second group before one
        scored 1.5 has its first, and equals alternate), ties at random, each producer's freshest group
        first, at most ``producer_cap(count)`` from one producer; one place for a newcomer when the rest
        would all have standing. Without ``ranking`` every producer scores alike (round-robin)."""
        candidates = [p for p in self.groups if p.group.informative]
        self._rng.shuffle(candidates)
        score = ranking.score if ranking is not None else (lambda _: 1.0)
        scores = {producer: score(producer) for producer in {p.group.provenance.producer for p in candidates}}
        candidates.sort(key=lambda p: -p.arrived_round)  # stable: shuffled order kept within a tier
        turns: Counter[str] = Counter()  # groups of each producer ahead of this one
        firsts: dict[str, PooledGroup] = {}  # each producer's freshest group
        keyed = []
        for pooled in candidates:
            producer = pooled.group.provenance.producer
            turns[producer] += 1
            firsts.setdefault(producer, pooled)
            if turns[producer] <= producer_cap(count):
                quotient = scores[producer] / turns[producer] if scores[producer] > 0 else scores[producer]
                keyed.append(((-pooled.arrived_round, -quotient, turns[producer]), pooled))
        keyed.sort(key=lambda item: item[0])  # stable: ties at random
        chosen = [pooled for _, pooled in keyed[:count]]
        if ranking is not None and len(chosen) == count:
            chosen = _with_newcomer(chosen, firsts, ranking)
        chosen_ids = {id(p) for p in chosen}
        self.groups = [p for p in self.groups if id(p) not in chosen_ids and p.group.informative]
        return [p.group for p in chosen]


def _with_newcomer(
    chosen: list[PooledGroup], firsts: dict[str, PooledGroup], ranking: Ranking
) -> list[PooledGroup]:
    """``chosen`` with its last place given to the freshest group of the first of ``ranking.newcomers``
    among the producers in ``firsts`` without standing, if every chosen producer has standing (module
    docstring)."""
    if not all(ranking.has_standing(p.group.provenance.producer) for p in chosen):
        return chosen
    newcomers = ranking.newcomers(p for p in firsts if not ranking.has_standing(p))
    if not newcomers:
        return chosen
    ranking.grant_newcomer(newcomers[0])
    return chosen[:-1] + [firsts[newcomers[0]]]
