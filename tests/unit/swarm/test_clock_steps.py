"""A sender whose wall clock steps back (an NTP step, a laptop waking) stays in order for its receivers.

chaos's node01 ran 20 s ahead, then was set right: its cards and announcements got higher seqs but older
timestamps, and a peer that saw a newer one first rejected the older one as a ``replay`` (CI, 2026-11-25).
"""

from __future__ import annotations

import time

import pytest

from swarmnode.config import SwarmConfig
from swarmnode.identity import Identity
from swarmnode.swarm.exchange.announcer import Announcer
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire import limits

START = 1_790_000_000.0


class SteppingClock:
    """``time.time`` for the sender: set by the test, stepping back when it says so."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stepping(monkeypatch: pytest.MonkeyPatch) -> SteppingClock:
    clock = SteppingClock()
    monkeypatch.setattr(time, "time", clock)
    return clock


@pytest.mark.parametrize("step_back_s", [0.5, 20.0, limits.MAX_CLOCK_SKEW_S - 1.0])
def test_cards_signed_across_a_step_back_are_superseded_not_replays(tmp_path, stepping, step_back_s) -> None:
    key = tmp_path / "node.key"
    Identity.generate().save(key)
    announcer = Announcer(
        Transport(key, SwarmConfig()), Identity.load(key), "clock", model_name="m", tokenizer_fingerprint="f",
        extra={}, ttl_s=60.0, roster_size=lambda: 0,
    )  # fmt: skip
    stepping.now = START + step_back_s  # running ahead
    ahead = announcer.card()
    stepping.now = START  # set right
    cards = [announcer.card(), announcer.card()]
    for earlier, later in zip([ahead, *cards], cards, strict=False):
        assert later.seq > earlier.seq and later.timestamp > earlier.timestamp
    # the DHT keeps, per subkey, the record that expires last (signed timestamp + lifetime): the newest
    assert cards[-1].timestamp > ahead.timestamp
    # a receiver that reads the newest card first and the one signed ahead after it ignores the older
    book = PeerBook(time.monotonic)
    assert book.check_sequence("p", "roster_card", cards[-1].seq, b"new", cards[-1].timestamp) == "new"
    assert book.check_sequence("p", "roster_card", ahead.seq, b"old", ahead.timestamp) == "superseded"


def test_after_a_step_back_beyond_the_skew_receivers_allow_timestamps_start_again_from_the_clock(
    stepping,
) -> None:
    """Stamps signed more than MAX_CLOCK_SKEW_S ahead were stale for every receiver with a right clock:
    holding the timestamp above them would keep the sender stale until its clock caught up."""
    stamps = limits.Stamper()
    stepping.now = START + limits.MAX_CLOCK_SKEW_S + 70.0
    ahead_seq, _ = stamps.stamp()
    stepping.now = START
    seq, timestamp = stamps.stamp()
    assert timestamp == START and seq > ahead_seq
    limits.check_fresh(timestamp, START)  # fresh for a receiver with a right clock
