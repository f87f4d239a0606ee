"""PeerBook: growing bans, strikes, token buckets, sequence numbers, reputation, bounded memory (the
score behind standing: test_standing_score.py)."""

from __future__ import annotations

import pytest

from swarmnode.swarm.exchange.peers import IMMEDIATE_BAN_REASONS, MiB, PeerBook
from swarmnode.swarm.exchange.verify import VERIFY_REASONS
from swarmnode.swarm.wire.limits import MAX_FRAME_BYTES, REJECT_REASONS, ProtocolError
from tests.helpers.clocks import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_ban_durations_grow_cap_and_expire(clock: FakeClock) -> None:
    book = PeerBook(clock, ban_base_s=60, ban_factor=2, ban_max_s=200)
    assert not book.is_banned("p")
    for expected in (60, 120, 200, 200):  # 240 is capped at ban_max_s
        assert book.ban("p", "bad_task") == expected
        assert book.is_banned("p")
        clock.advance(expected - 0.5)
        assert book.is_banned("p")
        clock.advance(0.5)
        assert not book.is_banned("p")


def test_ban_durations_default_policy(clock: FakeClock) -> None:
    book = PeerBook(clock)
    assert [book.ban("p", "x") for _ in range(8)] == [60, 120, 240, 480, 960, 1920, 3600, 3600]
    book = PeerBook(clock, ban_factor=1e300)  # no float overflow however many bans
    assert [book.ban("q", "x") for _ in range(4)] == [60, 3600, 3600, 3600]


def test_bans_listing_for_status(clock: FakeClock) -> None:
    book = PeerBook(clock)
    book.ban("a", "bad_signature")
    clock.advance(10)
    book.ban("b", "rate_limited")
    book.ban("b", "rate_limited")  # second ban: 120 s
    assert book.bans() == [("b", 120.0, 2, "rate_limited"), ("a", 50.0, 1, "bad_signature")]
    clock.advance(60)
    assert book.bans() == [("b", 60.0, 2, "rate_limited")]


def test_strikes_ban_at_the_limit_then_reset(clock: FakeClock) -> None:
    book = PeerBook(clock, strike_limit=3)
    assert not book.strike("p", "reward_mismatch")
    assert not book.strike("p", "bad_task")
    assert book.strike("p", "reward_mismatch")
    assert book.is_banned("p")
    assert book.bans()[0][1:] == (60.0, 1, "reward_mismatch")
    clock.advance(60)
    assert not book.is_banned("p")
    assert not book.strike("p", "bad_task")  # strikes were reset by the ban
    assert book.strike("p", "bad_task", weight=2.0)  # a heavier strike counts more
    assert book.bans()[0][1:] == (120.0, 2, "bad_task")


@pytest.mark.parametrize("reason", sorted(IMMEDIATE_BAN_REASONS))
def test_forgery_and_floods_ban_immediately(clock: FakeClock, reason: str) -> None:
    book = PeerBook(clock, strike_limit=100)
    assert book.strike("p", reason)
    assert book.is_banned("p")


def test_immediate_ban_reasons_are_known_reasons() -> None:
    assert IMMEDIATE_BAN_REASONS <= set(REJECT_REASONS) | set(VERIFY_REASONS)
    assert IMMEDIATE_BAN_REASONS == {"bad_signature", "peer_id_mismatch", "wrong_sender", "rate_limited"}


def test_reputation_rises_slowly_falls_fast_and_is_bounded(clock: FakeClock) -> None:
    book = PeerBook(clock, strike_limit=100)
    assert book.reputation("p") == 0.0
    book.reward("p", 10)
    assert book.reputation("p") == pytest.approx(0.1)
    book.strike("p", "bad_task")
    assert book.reputation("p") == pytest.approx(-0.15)
    book.reward("p", 10_000)
    assert book.reputation("p") == 1.0
    for _ in range(50):
        book.strike("p", "bad_task")
    assert book.reputation("p") == -1.0


def test_batch_bucket_refills_with_the_clock(clock: FakeClock) -> None:
    book = PeerBook(clock, batch_rate_per_min=12, burst=4)
    assert [book.allow("p", 100) for _ in range(5)] == [True, True, True, True, False]
    clock.advance(4.9)  # 12 per minute = one every 5 s
    assert not book.allow("p", 100)
    clock.advance(0.1)
    assert book.allow("p", 100)
    assert not book.allow("p", 100)
    clock.advance(3600)  # refills up to the burst, not beyond
    assert [book.allow("p", 100) for _ in range(5)] == [True, True, True, True, False]
    assert book.allow("q", 100)  # buckets are per peer


def test_byte_bucket_limits_volume_and_spends_nothing_on_refusal(clock: FakeClock) -> None:
    book = PeerBook(clock, batch_rate_per_min=60, byte_rate_per_min=6 * MiB, burst=100)
    capacity = 10 * MiB  # burst x the average allowed batch (6 MiB / 60 batches)
    assert book.allow("p", capacity - MiB)
    assert not book.allow("p", 2 * MiB)  # refused: neither bucket is charged
    assert book.allow("p", MiB)
    assert not book.allow("p", 1)
    clock.advance(10)  # 6 MiB per minute
    assert book.allow("p", MiB)
    assert not book.allow("p", 1)
    assert not book.allow("q", capacity + 1)  # larger than the bucket: never


def test_byte_bucket_always_holds_one_maximum_frame(clock: FakeClock) -> None:
    book = PeerBook(clock, byte_rate_per_min=1024, burst=1)
    assert book.allow("p", MAX_FRAME_BYTES)
    assert not book.allow("p", 1)


def test_check_sequence_new_duplicate_superseded_replay(clock: FakeClock) -> None:
    book = PeerBook(clock)
    assert book.check_sequence("p", "batch_announcement", 10, b"a" * 32, 100.0) == "new"
    assert book.check_sequence("p", "batch_announcement", 10, b"a" * 32, 100.0) == "duplicate"
    for seq, timestamp in ((10, 100.0), (9, 100.5), (9, 100.0)):  # seq reused, signed no earlier
        with pytest.raises(ProtocolError) as info:
            book.check_sequence("p", "batch_announcement", seq, b"b" * 32, timestamp)
        assert info.value.reason == "replay"
    # an older record (lower seq, signed earlier) read after the newer one: a lagging replica's
    assert book.check_sequence("p", "batch_announcement", 9, b"c" * 32, 99.0) == "superseded"
    assert book.check_sequence("p", "roster_card", 9, b"c" * 32, 99.0) == "new"  # per message type
    assert book.check_sequence("q", "batch_announcement", 1, b"c" * 32, 1.0) == "new"  # and per peer
    assert book.check_sequence("p", "batch_announcement", 11, b"d" * 32, 101.0) == "new"
    # a lagging DHT replica returns the previous record again: a duplicate, not a replay
    assert book.check_sequence("p", "batch_announcement", 10, b"a" * 32, 100.0) == "duplicate"


def test_memory_cap_evicts_least_recently_seen_unbanned_peer(clock: FakeClock) -> None:
    book = PeerBook(clock, max_peers=3)
    book.ban("banned", "bad_signature")  # oldest, but banned: kept
    book.reward("old")
    book.reward("recent")
    book.allow("old", 1)  # "old" seen again: now "recent" is the least recently seen
    book.reward("new")
    assert len(book) == 3
    assert "recent" not in book and {"banned", "old", "new"} <= {p for p in book.snapshot()["peers"]}
    assert book.is_banned("banned")


def test_a_flood_of_fresh_identities_does_not_evict_peers_with_standing(clock: FakeClock) -> None:
    """At the default cap: 4,096 fresh identities touched after this node trained on an honest peer
    (each a rate-limit check, as a notice or batch from a Sybil costs) leave the honest peer's record, and
    so its standing; before, the least recently seen peer went first, whoever it was."""
    book = PeerBook(clock)
    book.credit_trained("honest", 4)
    for i in range(book.max_peers * 2):
        clock.t += 0.001
        book.allow(f"sybil-{i}", 1024)
    assert len(book) == book.max_peers
    assert book.has_standing("honest") and "sybil-0" not in book


def test_memory_cap_when_every_peer_is_banned(clock: FakeClock) -> None:
    book = PeerBook(clock, max_peers=2)
    book.ban("a", "x")
    book.ban("b", "x")
    book.ban("b", "x")  # b: 120 s, a: 60 s -> a expires first and makes room
    book.ban("c", "x")
    assert "a" not in book and book.is_banned("b") and book.is_banned("c")


def test_lookups_do_not_create_entries(clock: FakeClock) -> None:
    book = PeerBook(clock, max_peers=2)
    for i in range(100):
        assert not book.is_banned(f"made-up-{i}")
        assert book.reputation(f"made-up-{i}") == 0.0
    assert len(book) == 0


def test_snapshot(clock: FakeClock) -> None:
    book = PeerBook(clock)
    book.reward("good", 4)
    book.strike("bad", "bad_signature")
    snap = book.snapshot()
    assert snap["tracked_peers"] == 2 and snap["banned_peers"] == 1 and snap["bans_total"] == 1
    assert snap["peers"]["good"]["accepted_groups"] == 4
    assert snap["peers"]["bad"]["banned_for_s"] == 60.0
    assert snap["peers"]["bad"]["last_reason"] == "bad_signature"


@pytest.mark.parametrize(
    "kwargs",
    [{"ban_base_s": 0}, {"ban_factor": 0.5}, {"ban_max_s": 1}, {"strike_limit": 0}, {"burst": 0}],
)
def test_bad_settings_are_refused(kwargs) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PeerBook(**kwargs)
