"""What the puller (exchange/puller.py) holds of a batch: ``Pending``, announced and not yet pulled, with
its holders and tries; ``Pulled``, its bytes as one holder served them, unverified (exchange/intake.py
verifies them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from swarmnode.swarm.exchange.round_budget import local_time
from swarmnode.swarm.wire.protocol import BatchAnnouncement


@dataclass
class Pending:
    """A batch announced and not yet pulled."""

    announcement: BatchAnnouncement
    holders: list[str]  # the author first, then holders in the order heard of
    via: str  # "notice" or "poll": what showed it first
    get_started: float
    seen: float
    record_digest: bytes
    record: bytes  # the author's signed announcement, for notices that offer the batch on
    attempts: Counter = field(default_factory=Counter)  # per holder
    pulling: bool = False
    holders_failed_at: float | None = None  # monotonic time every holder had failed (behind NAT)

    @property
    def author(self) -> str:
        return self.holders[0]

    @property
    def announced(self) -> float:
        """When it counts as announced here: the signed timestamp clamped to when it was first heard of."""
        return local_time(self.announcement.timestamp, self.seen)


@dataclass(frozen=True)
class Pulled:
    """A batch's bytes as one holder served them, unverified, with its timing trace."""

    pending: Pending
    holder: str
    data: bytes
    trace: dict
