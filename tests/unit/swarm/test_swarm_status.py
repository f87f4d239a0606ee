"""The frozen swarm status: what status.json holds is what the metrics and ``swarmnode status`` read."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import replace

from swarmnode.identity import Identity
from swarmnode.metrics import NodeCollector
from swarmnode.swarm.exchange.records import ArrivalHistogram, RoundCounts, SwarmCounters, traffic_totals
from swarmnode.swarm.exchange.status import DHTHealth, PeerStatus, RolloutTotals, SwarmStatus
from swarmnode.swarm.net.counts import PullCounts, ServingCounts, TransportCounts
from tests.helpers.scripted_net import data_plane_parts


def test_a_status_survives_its_round_trip_through_status_json():
    """``swarmnode status`` and the tests read status.json back into a SwarmStatus: nothing is lost."""
    status = SwarmStatus(
        peer_id="12D3KooWme", swarm_id="s", addrs=("/ip4/127.0.0.1/tcp/1",), round=3, policy_version=2,
        model="tiny", tokenizer="ab", connected=1, dht=DHTHealth(True, 1.0, 2.0, 3, 4), updated=5.0,
        peers={"12D3KooWp": PeerStatus("tiny", "ab", 1, 2, 0.5, False)},
        rollouts=RolloutTotals(1, 2, 3, 4, 5, 6, 7),
        arrival=ArrivalHistogram([0, 1, 1, 1, 1, 1, 1, 1], 0.3, 1),
        rejected={"stale": 1}, fetch_failures={"timeout": 2}, roster_refused={"roster_full": 1},
        notices={"received": 4}, pulls_by_source={"notice": 3}, bans=(("12D3KooWbad", 59.0, 1, "forged"),),
    )  # fmt: skip
    as_json = json.loads(json.dumps(status.as_dict()))
    assert SwarmStatus.from_dict(as_json) == status
    assert as_json["arrival_s"]["buckets"]["0.25"] == 1 and as_json["bans"][0]["reason"] == "forged"


def test_roster_refusals_reach_prometheus_by_reason(tmp_path, bank):
    """Cards the roster refuses are counted by reason in the status and exported as
    ``swarmnode_roster_refused_total{reason}`` (``roster_full`` from 0, so an alert has a series)."""
    parts = data_plane_parts(tmp_path, bank)
    parts.roster.admit(Identity.generate().peer_id, b"\xc1 not a card", time.time())
    parts.roster.admit(Identity.generate().peer_id, b"\xc1 nor this", time.time())
    status = SwarmStatus.take(
        roster=parts.roster, arrivals=parts.arrivals.snapshot(), book=parts.book, rejections={}
    )
    assert status.roster_refused == {"malformed": 2}
    collector = NodeCollector({})
    collector.observe_swarm(status)
    refused = {
        sample.labels["reason"]: sample.value
        for family in collector.collect()
        for sample in family.samples
        if sample.name == "swarmnode_roster_refused_total"
    }
    assert refused == {"roster_full": 0, "malformed": 2}


def test_round_counts_hold_each_rounds_traffic_from_the_cumulative_counters():
    """The per-round network work a node's metrics.jsonl carries (docs/scaling.md): notices, pulls and
    bytes are the growth of the transport's and the notice receiver's totals since the previous round."""
    counts, counters = RoundCounts(), SwarmCounters()
    pulls = PullCounts(fetch_ok=5, fetch_bytes=9000, fetch_failed={"timeout": 2}, notices_sent=7)
    transport = TransportCounts(serving=ServingCounts(served_bytes=100), pulls=pulls)
    first = counts.take(counters, Counter(), traffic_totals(transport, {"received": 6, "rate_limited": 3}))
    assert first.traffic == {
        "notices_sent": 7,
        "notices_received": 6,
        "pulls": 7,
        "bytes_in": 9000,
        "bytes_out": 100,
    }
    transport = replace(transport, pulls=replace(pulls, notices_sent=10, fetch_ok=6, fetch_bytes=9500))
    second = counts.take(counters, Counter(), traffic_totals(transport, {"received": 8}))
    assert second.traffic == {
        "notices_sent": 3,
        "notices_received": 2,
        "pulls": 1,
        "bytes_in": 500,
        "bytes_out": 0,
    }
    assert second.as_dict()["peer_pulls"] == 1
