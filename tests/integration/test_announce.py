"""The announce lifecycle between two real swarm nodes in this process (real hivemind DHTs on 127.0.0.1):
the roster card is re-declared on the announcer's own timer while no exchange runs, a clean shutdown's
offline card takes the node out of its peer's roster at once, an old offline card replayed into the DHT
cannot knock a live node out, and the hello stream tells a peer our swarm id (at a bounded rate)."""

from __future__ import annotations

import threading
import time

import pytest

from benchmarks.harness.waiting import wait_until
from swarmnode.swarm.exchange import announcer
from swarmnode.swarm.exchange.swarm import Swarm
from swarmnode.swarm.net import hello
from swarmnode.swarm.wire import codec, dht_rules
from tests.helpers.inprocess_swarm import make_swarm

SWARM = "it-announce"
PERIOD_S = 0.5  # the announcer's timer, short so the test takes seconds (the default is ttl / 4)


def _node(tmp_path, name: str, initial_peers: list[str], swarm_id: str = SWARM) -> Swarm:
    return make_swarm(tmp_path, name, initial_peers, swarm_id)


@pytest.fixture
def pair(tmp_path):
    a = _node(tmp_path, "a", [])
    a.announcer.period_s = PERIOD_S
    started = [a]
    try:
        addrs = a.start()
        b = _node(tmp_path, "b", addrs[:1])
        started.append(b)
        b.start()
        yield a, b
    finally:
        for node in started:
            node.shutdown()


def test_the_card_is_redeclared_on_its_own_timer_and_withdrawn_at_shutdown(pair):
    a, b = pair
    peer = a.identity.peer_id
    assert wait_until(lambda: peer in b.service.refresh_roster(), 20.0, 0.2)
    first = b.roster.cards[peer]
    a.announcer.set_progress(7, 3)  # what the round loop does; no exchange runs in this test
    assert wait_until(
        lambda: peer in b.service.refresh_roster() and b.roster.cards[peer].round == 7, 20.0, 0.2
    )
    latest = b.roster.cards[peer]
    assert latest.seq > first.seq and latest.timestamp > first.timestamp and latest.policy_version == 3
    # a counts a card once its put returns, which can be after b has already read it
    assert wait_until(lambda: a.announcer.announced >= 2, 20.0, 0.2)

    t_stop = time.monotonic()
    a.shutdown()  # a clean stop: the offline card first, then the network
    assert time.monotonic() - t_stop < 15.0
    assert peer not in b.service.refresh_roster() and peer not in b.roster.cards


def test_an_exchange_in_progress_stops_waiting_for_a_node_that_went_offline(pair):
    a, b = pair
    peer = a.identity.peer_id
    deadline_s = 30.0  # what b would wait without the offline card: a never publishes a batch
    longer = b.cfg.swarm.model_copy(update={"share_deadline_s": deadline_s})
    b.cfg = b.cfg.model_copy(update={"swarm": longer})

    def a_is_live() -> bool:
        return peer in b.roster.live

    assert wait_until(a_is_live, 20.0, 0.2)
    took: list[float] = []

    def exchange() -> None:
        t0 = time.monotonic()
        b.exchange(1, 0, [])
        took.append(time.monotonic() - t0)

    waiting = threading.Thread(target=exchange)
    waiting.start()
    time.sleep(1.0)
    a.shutdown()  # a clean stop, mid-exchange
    waiting.join(deadline_s + 10)
    assert took and took[0] < deadline_s / 3, took


def test_an_old_offline_card_replayed_does_not_knock_a_live_node_out(pair):
    a, b = pair
    peer = a.identity.peer_id
    stale = codec.encode_message(a.identity, SWARM, a.announcer.card(offline=True))  # never stored by a
    signed_at = time.time()
    # online cards follow it for longer than the DHT's clock tolerance
    time.sleep(dht_rules.RECORD_CLOCK_TOLERANCE_S + 2 * PERIOD_S)
    assert wait_until(lambda: peer in b.service.refresh_roster(), 20.0, 0.2)
    # the replay, with the latest expiration storing nodes allow for its timestamp
    lifetime = signed_at + dht_rules.MAX_RECORD_TTL_S + dht_rules.RECORD_CLOCK_TOLERANCE_S - 0.5 - time.time()
    key = dht_rules.roster_key(SWARM, peer)
    b.transport.records.put(key, peer, stale, lifetime)
    for _ in range(3):
        assert peer in b.service.refresh_roster(), b.roster.refused
        card = codec.decode_message(b.transport.records.get(key)[peer], swarm_id=SWARM)[0]
        assert not card.offline  # storing nodes kept a's newer online card
        time.sleep(PERIOD_S)


def test_hello_answers_our_swarm_id_at_a_bounded_rate(pair):
    a, b = pair
    peer = a.identity.peer_id

    def ask() -> str | None:
        return b.transport.submit(lambda p2p: hello.ask(p2p, peer)).result(hello.ASK_TIMEOUT_S + 2)

    answers = [ask() for _ in range(hello.MAX_HELLOS_PER_MINUTE + 10)]  # the worst case: asked at once
    assert answers[0] == SWARM
    assert answers.count(SWARM) <= hello.MAX_HELLOS_PER_MINUTE
    assert answers[-1] is None and a.announcer.hello.refused >= 10


def test_a_node_joined_through_another_swarm_is_told_its_peers_swarm_id(pair, tmp_path, monkeypatch, capfd):
    a, _ = pair
    monkeypatch.setattr(announcer, "LONELY_AFTER_S", 2.0)  # 30 s in a node: shortened, the check is the same
    monkeypatch.setattr(announcer, "WATCH_PERIOD_S", 0.5)
    lost = _node(tmp_path, "lost", a.addrs[:1], swarm_id="elsewhere")
    said: list[str] = []

    def told() -> bool:
        said.append(capfd.readouterr().err)
        return "this node is in swarm 'elsewhere'" in "".join(said)

    try:
        lost.start()
        assert wait_until(told, 30.0, 0.2)
    finally:
        lost.shutdown()
    # the lost node's line (the pair's nodes, under the same shortened timer, may speak too while their
    # roster is still empty: seen in CI)
    line = next(line for line in "".join(said).splitlines() if "this node is in swarm 'elsewhere'" in line)
    assert f"its connected peers are in '{SWARM}'" in line and f"--set swarm.swarm_id={SWARM}" in line
