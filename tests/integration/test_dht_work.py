"""Free keys cannot fill a storing node's room for the swarm's records (real hivemind DHT nodes on 127.0.0.1).

An outside attacker (a bare hivemind DHT speaking hivemind's RPCs straight to the honest server) stores
2 048 validly signed, fresh announcements of the honest node's own swarm from free keys (no identity work:
~0.7 s to make) and 64 work-less roster cards into one roster shard. Before the storing rule checked
identity work these filled the node's home-swarm budget (2 048 records) and the shard (64 subkeys), and the
node refused the swarm's new honest card and announcement. Now the cards are refused for lacking work and
work-less announcements fill only their share of the budget: an honest card with work, an announcement of
that signer without a nonce of its own (its card is held there), and an announcement carrying its
signer's nonce are stored and read back.
"""

from __future__ import annotations

import functools
import time

import hivemind

from swarmnode.identity import Identity
from swarmnode.swarm.net import dht
from swarmnode.swarm.wire import dht_rules
from tests.helpers import dht_attacker

SWARM = "work-home"
WORK_BITS = 8  # the swarm's d: what its nodes ask of an identity (tests use 8: a mint is instant)
FREE_ANNOUNCEMENTS = 2048  # a storing node's whole home-swarm budget (dht_guard.MAX_HOME_RECORDS)
WORKLESS_SHARE = 0.25  # what records without work may take of it (dht_guard; not imported: runs on old code)
FREE_CARDS = 64  # a whole roster shard (dht_rules.MAX_SUBKEYS_PER_KEY)
RECORD_WAIT_S = 20.0
ATTACK_TIMEOUT_S = 180.0


def _run(attacker: hivemind.DHT, coroutine, **kwargs) -> int:
    future = attacker.run_coroutine(functools.partial(coroutine, **kwargs), return_future=True)
    return future.result(ATTACK_TIMEOUT_S)


def _in_shard(tag: bytes, shard: int) -> Identity:
    return next(
        identity
        for identity in (dht_attacker.sybil(tag, i) for i in range(1000))
        if dht_rules.roster_shard(identity.peer_id) == shard
    )


def test_free_keys_filling_a_storing_node_leave_room_for_an_honest_card_and_announcements(dht_world):
    # the one DHT server: every record is stored there; the writer is a client and stores nothing itself
    server, _, addrs = dht_world.honest("server", SWARM, [])
    writer, _, _ = dht_world.honest("writer", SWARM, addrs, mode="private")
    attacker = dht_world.attacker(addrs)

    shard = 0
    indices = [
        i for i in range(2000) if dht_rules.roster_shard(dht_attacker.sybil(b"free-card", i).peer_id) == shard
    ]
    t = time.monotonic()
    carded = _run(
        attacker, dht_attacker.store_cards, swarm=SWARM, tag=b"free-card", indices=indices[:FREE_CARDS]
    )
    announced = _run(
        attacker, dht_attacker.store_announcements, swarm=SWARM, tag=b"free", count=FREE_ANNOUNCEMENTS
    )
    print(f"free keys: {announced} of {FREE_ANNOUNCEMENTS} announcements and {carded} of {FREE_CARDS} cards "
          f"stored in {time.monotonic() - t:.1f} s; {server.dht_stats()}")  # fmt: skip

    honest = _in_shard(b"honest", shard)  # its card goes to the shard the free cards were sent to
    now = time.time()
    card = dht_attacker.card(honest, SWARM, now, work_bits=WORK_BITS)
    assert dht.put_card(writer.records, SWARM, honest.peer_id, card, 60), "the honest card was refused"
    roster = dict(dht.read_roster(writer.records, SWARM, RECORD_WAIT_S, shards=[shard]))
    assert roster.get(honest.peer_id) == card

    # an announcement as the node publishes it today (no nonce of its own): its signer's card is held here
    plain = dht_attacker.announcement(honest, SWARM, now)
    assert dht.put_announcement(writer.records, SWARM, honest.peer_id, plain, RECORD_WAIT_S), "refused"
    # an announcement carrying its signer's proof: kept by a storing node that holds no card of it
    other = dht_attacker.sybil(b"honest-other", 0)
    proven = dht_attacker.announcement(other, SWARM, now, work_bits=WORK_BITS)
    assert dht.put_announcement(writer.records, SWARM, other.peer_id, proven, RECORD_WAIT_S), "refused"
    found = dict(
        (author, record)
        for record, author in dht.read_announcements(
            writer.records, SWARM, [honest.peer_id, other.peer_id], 5.0
        )
    )
    assert found == {honest.peer_id: plain, other.peer_id: proven}
    assert carded == 0, "work-less cards of the node's own swarm were stored"
    assert announced <= WORKLESS_SHARE * FREE_ANNOUNCEMENTS, "work-less announcements took the home budget"
