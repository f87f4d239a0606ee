"""The frozen swarm status: what status.json holds is what the metrics and ``swarmnode status`` read."""

from __future__ import annotations

import json

from swarmnode.swarm.exchange.records import ArrivalHistogram
from swarmnode.swarm.exchange.status import DHTHealth, PeerStatus, RolloutTotals, SwarmStatus


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
