"""What the round thread and the data plane's service thread share, under one lock.

The round thread publishes, waits on ``changed`` and takes J groups from ``pool``; the service thread's
stages pool verified groups, count what happened and ``settle`` the peers whose batch arrived (or cannot
arrive). ``round`` is this node's round as the pool's freshness tiers see it: batches arriving while
round r runs count for round r, and from the end of its exchange for round r + 1. Every field is read
and written under ``lock``; ``changed`` (a Condition on it) is notified whenever a batch settles or the
roster is read. The ``Roster`` takes the same lock.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from swarmnode.swarm.exchange.pool import GroupPool
from swarmnode.swarm.exchange.records import ShareTrace, SwarmCounters


@dataclass
class ExchangeState:
    trace: ShareTrace
    lock: threading.RLock = field(default_factory=threading.RLock)
    pool: GroupPool = field(default_factory=GroupPool)  # ties broken by os.urandom: not predictable
    counters: SwarmCounters = field(default_factory=SwarmCounters)
    # peers not to wait for any more this exchange: their batch arrived (accepted or rejected) or cannot
    # arrive (the pull failed for good, e.g. the peer left right after publishing)
    settled: set[str] = field(default_factory=set)
    round: int = 0
    # time.time() when ``round`` last changed (``open_round``): batches announced before are the last round's
    round_opened: float = 0.0
    # the last round whose pull budget was spent with its pulls ended: nothing more arrives for it
    pulls_done_round: int = -1
    pulls_by_source: Counter[str] = field(default_factory=Counter)  # "notice" / "poll" / "holder"

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def open_round(self, round_: int) -> None:
        """From now on arriving batches count for our round ``round_`` (the pool's tier, the pull budget)."""
        with self.lock:
            if round_ != self.round:
                self.round, self.round_opened = round_, time.time()

    def settle(self, peer: str) -> None:
        """``peer`` is not waited for any more this exchange; wakes the round thread."""
        with self.lock:
            self.settled.add(peer)
            self.changed.notify_all()
