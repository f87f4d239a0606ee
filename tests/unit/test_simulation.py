"""The data-plane simulation (#27): its event loop, counts a hand can check, how each protocol's per-node
work grows with the swarm, what silent holders cost, the code's ring, round budget and roster pages, and the
adapter to loopback runs."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from benchmarks.simulation.engine import Simulation, simulate
from benchmarks.simulation.load import dht_keys_per_round, roster_read_s
from benchmarks.simulation.node import Batch, EventLoop
from benchmarks.simulation.scenario import Protocol, Scenario
from benchmarks.simulation.validation import compare, loopback_per_node, per_node_from_metrics
from swarmnode.swarm.exchange import fanout, puller, roster, service, standing
from swarmnode.swarm.wire import dht_rules

QUICK = dict(churn_per_min=0.0, silent_share=0.0, rtt_s=0.05, round_s=20.0, deadline_s=10.0)


def test_the_event_loop_runs_events_in_time_order_ties_in_scheduling_order_and_stops_at_until():
    loop, seen = EventLoop(), []
    loop.at(3.0, seen.append, "c")
    loop.at(1.0, seen.append, "a1")
    loop.at(1.0, seen.append, "a2")
    loop.at(9.0, seen.append, "late")
    loop.at(2.0, lambda: loop.after(0.5, seen.append, "b"))  # scheduled while running, still in order
    loop.run(until=5.0)
    assert seen == ["a1", "a2", "b", "c"]
    assert loop.now == 5.0
    loop.run(until=10.0)
    assert seen[-1] == "late"


def test_today_at_four_nodes_every_batch_makes_three_notices_three_pulls_three_verifications():
    scenario = Scenario(nodes=4, observers=4, rounds=6, **QUICK)
    sim = Simulation(scenario, Protocol.today())
    sim.start()
    sim.loop.run(scenario.duration_s)
    settled = [b for b in sim.batches if b.published < scenario.duration_s - scenario.deadline_s]
    assert len(settled) >= 3 * 4  # every node published at least 3 of its 6 rounds' batches
    assert {(b.notices, b.pulls, len(b.verified_by)) for b in settled} == {(3, 3, 3)}
    result = sim.result()
    assert result.per_node["notices_sent"] == 3.0 and result.per_node["notices_received"] == 3.0
    assert result.per_node["pulls"] == pytest.approx(3.0, abs=0.35)  # rounds cut by the window's edges
    assert result.fill_share == 1.0


def _notices(protocol: Protocol, nodes: int) -> float:
    scenario = Scenario(nodes=nodes, observers=16, rounds=4, warmup_rounds=1, **QUICK)
    return simulate(scenario, protocol).per_node["notices_sent"]


def test_targets_notices_per_node_stay_flat_as_the_swarm_grows_while_todays_grow_with_it():
    target = Protocol.target(view=32, fanout=6, hops=2)
    small, large = _notices(target, 100), _notices(target, 1000)
    assert large / small <= 1.5
    assert small <= 6 + 6 * 6  # D from the publisher, at most D from each of its D receivers
    today_small, today_large = _notices(Protocol.today(), 16), _notices(Protocol.today(), 64)
    assert today_large / today_small == pytest.approx(63 / 15, rel=0.02)  # N - 1 each
    assert _notices(Protocol.today(), 1000) == pytest.approx(512, rel=0.01)  # the roster cap


def test_a_hop_limit_past_the_swarms_diameter_makes_notices_grow_with_the_swarm_again():
    flood = Protocol.target(view=32, fanout=6, hops=6)
    assert _notices(flood, 400) / _notices(flood, 100) > 3  # every node relays every notice to D peers


def test_sampled_gossip_walks_estimate_the_exact_notice_count():
    scenario = Scenario(nodes=300, observers=16, rounds=4, warmup_rounds=1, **QUICK)
    flood = Protocol.target(hops=4)
    exact = simulate(scenario, flood)
    sampled = simulate(replace(scenario, gossip_budget=2e5), flood)
    assert exact.exact_gossip_share == 1.0 and sampled.exact_gossip_share < 0.5
    assert sampled.per_node["notices_sent"] == pytest.approx(exact.per_node["notices_sent"], rel=0.1)


def test_a_silent_holder_keeps_a_probation_worker_for_its_whole_timeout():
    scenario = Scenario(nodes=3, observers=1, warmup_rounds=0, **(QUICK | {"round_s": 1000.0}))
    sim = Simulation(scenario, replace(Protocol.today(), probation_pulls=1))
    sim.start()  # rounds begin far later: only the two batches below happen in the first seconds
    observer = next(iter(sim.observers.values()))
    silent_author, honest_author = (n for n in range(3) if n != observer.id)
    silent = Batch(0, silent_author, 0.0, silent=True, informative=4)
    honest = Batch(1, honest_author, 0.0, silent=False, informative=4)
    observer.hear(silent, "notice")
    observer.hear(honest, "notice")
    sim.loop.run(10.0)
    timeout = puller.PROBATION_PULL_TIMEOUT_BASE_S + scenario.batch_bytes / puller.PULL_BYTES_PER_S
    assert standing.PROBATION_PULLS > 1  # the single worker is this test's, not the code's
    assert observer.id not in silent.verified_by
    assert timeout < honest.verified_by[observer.id] < timeout + 2 * scenario.rtt_s + 0.1
    assert silent_author in observer.failed_first
    assert sim.tallies["pull_failures"] == 1


def test_the_adapter_reads_per_node_counts_from_metrics_records_and_a_latency_report():
    records = [
        {"peer_notices_sent": 7, "peer_notices_received": 6, "peer_pulls": 7, "peer_bytes_in": 3500,
         "peer_bytes_out": 3000, "peer_batches_received": 6, "peer_rejected": {"stale": 1}},
        {"peer_notices_sent": 7, "peer_notices_received": 8, "peer_pulls": 5, "peer_bytes_in": 2500,
         "peer_bytes_out": 4000, "peer_batches_received": 5, "peer_rejected": {}},
    ]  # fmt: skip
    counts = per_node_from_metrics(records)
    assert counts == {"notices_sent": 7.0, "notices_received": 7.0, "pulls": 6.0, "verifications": 6.0,
                      "bytes_in": 3000.0, "bytes_out": 3500.0}  # fmt: skip
    report = {"results": [
        {"nodes": 8, "analysis": {"per_node_per_round": counts, "round_p50_s": 3.5, "fill_share": 0.99}},
        {"nodes": 16, "analysis": {"round_p50_s": 10.0}},  # a report from before the counts: skipped
        {"nodes": 32, "analysis": {"round_p50_s": 12.0,  # swarm_latency's own name for them
                                   "work_per_round": counts | {"pulls_max_node": 9, "rounds_filling_j": 1}}},
    ]}  # fmt: skip
    assert loopback_per_node(report) == {
        8: {"per_node": counts, "round_s": 3.5, "fill_share": 0.99},
        32: {"per_node": counts, "round_s": 12.0, "fill_share": 1.0},
    }
    verdicts = {name: ok for name, _, _, ok in compare({"pulls": 7.4, "bytes_in": 4000.0}, counts)}
    assert verdicts["pulls"] and not verdicts["bytes_in"] and not verdicts["notices_sent"]


def _started(nodes: int, protocol: Protocol, until: float, **changes) -> Simulation:
    scenario = Scenario(nodes=nodes, observers=4, rounds=6, **(QUICK | changes))
    sim = Simulation(scenario, protocol)
    sim.start()
    sim.loop.run(until)
    return sim


def test_on_the_ring_every_node_receives_exactly_d_notices_a_wave_and_the_senders_rotate():
    sim = _started(32, Protocol.bounded(), until=2 * QUICK["round_s"])  # each node has published
    d = fanout.NOTICE_FANOUT

    def received() -> Counter:
        return Counter(peer for author in range(32) for peer in sim.ring_targets(author))

    first = {author: sim.ring_targets(author) for author in range(32)}
    assert all(len(set(targets)) == d and author not in targets for author, targets in first.items())
    assert set(received().values()) == {d}
    sim.loop.run(sim.loop.now + fanout.NOTICE_ROTATION_S)
    assert set(received().values()) == {d}
    assert all(sim.ring_targets(author) != first[author] for author in range(32))


def test_a_publish_also_notifies_the_pullers_of_its_last_batches_off_the_ring():
    """The code's puller notices (fanout.with_pullers): observers off the ring that pulled one of the
    author's PULLED_BATCHES batches before the one being published, at most PULLER_NOTICES."""
    sim = _started(32, Protocol.bounded(), until=2 * QUICK["round_s"])
    author = 0
    ring = sim.ring_targets(author)
    off_ring = [n for n in range(1, 32) if n not in ring]
    sim.pulled_by[author] = {peer: -1 for peer in off_ring}  # pulled a batch older than the last ones
    assert sim._with_pullers(author, ring) == ring
    sim.publish(author)
    before = list(sim.recent_ids[author])[-2]  # the batch before its newest (which _with_pullers publishes)
    sim.pulled_by[author] = {peer: before for peer in off_ring}
    extra = sim._with_pullers(author, ring)[len(ring) :]
    assert len(extra) == fanout.PULLER_NOTICES and set(extra) < set(off_ring)
    sim.publish(author)  # the batch they pulled is now two before: they are still its pullers
    assert len(sim._with_pullers(author, sim.ring_targets(author))) > len(sim.ring_targets(author))


def test_the_ring_leaves_out_silent_members_who_never_earn_standing():
    sim = _started(64, Protocol.bounded(), until=2 * QUICK["round_s"], silent_share=0.3)
    silent = {n for n in range(64) if sim.silent[n]}
    assert silent and not silent & {p for a in range(64) for p in sim.ring_targets(a)}


def test_the_codes_budget_pulls_k_fresh_batches_of_authors_with_standing_and_probation_outside_k():
    sim = _started(40, Protocol.bounded(), until=0.0, round_s=1000.0, warmup_rounds=0)  # rounds: later
    observer = next(iter(sim.observers.values()))
    k = Protocol.bounded().pulls_per_round(sim.scenario.j)
    authors = [n for n in range(40) if n != observer.id]
    observer.standing = set(authors[: k + 3])
    observer.window_opened = 5.0
    sim.loop.run(6.0)
    old = Batch(0, authors[0], 4.0, silent=False, informative=4)  # of the last wave: dropped
    fresh = [Batch(1 + i, a, 6.0, silent=False, informative=4) for i, a in enumerate(authors[1 : k + 3])]
    share = Protocol.bounded().explorations_per_round(sim.scenario.j, few_peers=False)
    newcomers = [Batch(100 + i, a, 6.0, False, 4) for i, a in enumerate(authors[k + 3 : k + 3 + share])]
    for batch in [old, *fresh, *newcomers]:
        observer.hear(batch, "notice")
    sim.loop.run(20.0)
    assert observer.window_pulls == k
    assert sum(observer.id in b.verified_by for b in fresh) == k and observer.id not in old.verified_by
    assert all(observer.id in b.verified_by for b in newcomers)  # probation: their own share, outside K
    assert sim.tallies["dropped"] == 1 + 2  # the old one, and the two past K


def test_a_newcomers_share_of_k_over_4_starts_that_many_a_round_and_keeps_the_rest_for_later():
    """The model's knob (the code gives K, ``exploration_divisor`` 1; K / 4 was tried first)."""
    proto = replace(Protocol.bounded(), exploration_divisor=4)
    sim = _started(40, proto, until=0.0, round_s=1000.0, warmup_rounds=0)  # rounds: later
    settled, starting = list(sim.observers.values())[:2]
    j, k = sim.scenario.j, proto.pulls_per_round(sim.scenario.j)
    share = k // 4
    assert 3 * share <= 12 and k <= 12  # three rounds' shares, and all of K, among the 12 newcomers
    authors = [n for n in range(40) if n not in (settled.id, starting.id)]
    settled.standing = set(authors[:j])  # knows J peers with standing: K // 4 a round
    starting.standing = set(authors[: j - 1])  # fewer than J: all of K
    newcomers = [Batch(i, a, 1.0, silent=False, informative=4) for i, a in enumerate(authors[j : j + 12])]
    for batch in newcomers:
        settled.hear(batch, "notice")
        starting.hear(batch, "notice")
    sim.loop.run(5.0)
    assert sum(settled.id in b.verified_by for b in newcomers) == share
    assert sum(starting.id in b.verified_by for b in newcomers) == k
    for rounds in (2, 3):  # the rest wait, pending, for the next rounds' shares
        settled.end_exchange()
        sim.loop.run(sim.loop.now + 5.0)
        assert sum(settled.id in b.verified_by for b in newcomers) == rounds * share
    assert sim.tallies["dropped"] == 0


def test_a_roster_page_reads_two_of_the_eight_shards_so_a_quarter_of_a_full_reads_cards():
    result = simulate(Scenario(nodes=16, observers=4, rounds=3, warmup_rounds=1, **QUICK), Protocol.today())
    for nodes in (16, 1000):
        sized = replace(result, scenario=replace(result.scenario, nodes=nodes))
        full = dht_keys_per_round(sized)["cards_read"]
        never_full = replace(Protocol.bounded(), roster_read_full_s=None)
        paged = dht_keys_per_round(replace(sized, protocol=never_full))["cards_read"]
        assert paged / full == pytest.approx(service.ROSTER_PAGE_SHARDS / dht_rules.ROSTER_SHARDS)


def test_a_full_view_reads_its_roster_pages_at_the_full_views_pace():
    """The code's view (roster.VIEW_SIZE) is full once the swarm has more nodes than it holds: from then on
    a page every FULL_VIEW_PAGE_GAP_S instead of the lifetime's pace, in the model as in the code."""
    result = simulate(Scenario(nodes=16, observers=4, rounds=3, warmup_rounds=1, **QUICK), Protocol.bounded())
    never_full = replace(Protocol.bounded(), roster_read_full_s=None)
    for nodes, slower in ((16, 1.0), (roster.VIEW_SIZE, 1.0), (roster.VIEW_SIZE + 1, None), (10_000, None)):
        sized = replace(result, scenario=replace(result.scenario, nodes=nodes))
        pace = roster_read_s(replace(sized, protocol=never_full))
        ratio = (
            dht_keys_per_round(replace(sized, protocol=never_full))["cards_read"]
            / dht_keys_per_round(sized)["cards_read"]
        )
        assert ratio == pytest.approx(slower or service.FULL_VIEW_PAGE_GAP_S / pace)
