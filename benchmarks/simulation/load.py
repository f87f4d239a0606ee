"""What a simulated round costs: bytes, CPU seconds and DHT work per node, and the bootstrap nodes a swarm
needs (the cost side of ``benchmarks.simulation.engine``).

The simulation counts operations per node and round (notices, checks, pulls, verifications); this module
prices them with the per-operation costs of a cost table (``Costs``, read from
benchmarks/swarm_sim_costs.json, every number with its source) and adds the work that happens on timers
rather than per batch, by formula: roster reads, DHT polls and stores, view shuffles.

Bootstrap nodes, the model: a bootstrap is a DHT node whose address every config lists, plus the
relay of nodes behind NAT (swarmnode/bootstrap.py: client-mode nodes take their initial peers as static
relays). It carries (1) every newcomer's first lookups, since a newcomer's routing table holds only the
bootstraps (a ping, a find of its own id, its first roster pass, poll and two stores: one key each, at
the first hop), at the churn's join rate; (2) its share of all other DHT lookups, like any DHT server
(servers are the nodes not behind NAT, and the bootstraps), ``dht_hops`` key answers per lookup; within
``BOOTSTRAP_UTILIZATION`` of one core at the measured CPU per key answered; and (3) one relay reservation
per node behind NAT, at most ``RELAY_MAX_RESERVATIONS`` per bootstrap, each relaying what is sent to
its node (notices in, the payloads it serves). The count is the largest of the
three needs and ``MIN_BOOTSTRAPS``. The roster's shard keys are read by every node (today: all 8 every 2
s; bounded: a page of 2 every 2 s) and answered by the DHT nodes nearest each key, bootstrap or not:
``hot_key_*`` gives that load per storing node before hivemind's caching spreads it (an upper bound).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from benchmarks.simulation.engine import Result
from swarmnode.swarm.exchange.announcer import ANNOUNCES_PER_TTL
from swarmnode.swarm.exchange.service import roster_page_gap_s
from swarmnode.swarm.exchange.swarm import round_ttl_s
from swarmnode.swarm.net.daemon import RELAY_MAX_RESERVATIONS
from swarmnode.swarm.wire.dht_rules import MAX_SUBKEYS_PER_KEY, ROSTER_SHARDS

BOOTSTRAP_UTILIZATION = 0.5  # of a bootstrap's one DHT core, the most planned for
MIN_BOOTSTRAPS = 2  # one can be down
DHT_REPLICAS = 5  # hivemind's DHTNode num_replicas: nodes that store (and answer for) one key
STORES_PER_ROUND = 1  # the announcement; the card is re-put every ttl / ANNOUNCES_PER_TTL


@dataclass(frozen=True)
class Costs:
    """Per-operation costs by name (``values``) and where each came from (``sources``)."""

    values: dict[str, float]
    sources: dict[str, str]

    @classmethod
    def load(cls, path: Path) -> Costs:
        table = json.loads(Path(path).read_text())["costs"]
        return cls(
            {k: float(v["value"]) for k, v in table.items()}, {k: v["source"] for k, v in table.items()}
        )

    def __getitem__(self, name: str) -> float:
        return self.values[name]


def round_period_s(result: Result) -> float:
    """A node's round as simulated: sampling, the wait for J groups, training."""
    return result.scenario.round_s + result.per_node.get("exchange_wait_s", 0.0)


def cards_per_shard(nodes: int) -> float:
    """Roster cards one shard key holds: the swarm's share of it, at most a key's subkeys."""
    return min(nodes / ROSTER_SHARDS, MAX_SUBKEYS_PER_KEY)


def roster_read_s(result: Result) -> float:
    """Seconds between a node's roster reads: the protocol's, or the code's pace for this lifetime; the
    full view's pace where the swarm fills a node's view."""
    proto, given = result.protocol, result.protocol.roster_read_s
    pace = given if given is not None else roster_page_gap_s(round_ttl_s(result.scenario.deadline_s))
    if proto.roster_read_full_s is not None and proto.gossip and result.scenario.nodes - 1 >= proto.view:
        return max(pace, proto.roster_read_full_s)
    return pace


def dht_keys_per_round(result: Result) -> dict[str, float]:
    """DHT keys a node looks up and stores per round, and the records it reads (cards, announcements)."""
    sc, proto, period = result.scenario, result.protocol, round_period_s(result)
    members = min(sc.nodes - 1, proto.view if proto.gossip else proto.roster_cap)
    roster_reads = period / roster_read_s(result)
    cards_per_read = proto.roster_keys_read * cards_per_shard(sc.nodes)
    polls = period / proto.poll_interval_s
    card_puts = period / (round_ttl_s(sc.deadline_s) / ANNOUNCES_PER_TTL)
    return {
        "keys_read": roster_reads * proto.roster_keys_read + polls * min(proto.poll_keys, members),
        "keys_stored": STORES_PER_ROUND + card_puts,
        "cards_read": roster_reads * cards_per_read,
        "announcements_read": polls * min(proto.poll_keys, members),
    }


def per_node_costs(result: Result, costs: Costs, nat_share: float = 0.0) -> dict[str, float]:
    """Bytes (payload, notices, DHT, shuffles) and CPU seconds per node and round; a node not behind NAT
    (a DHT server: it answers its share of everyone's lookups)."""
    sc, proto, n = result.scenario, result.protocol, result.per_node
    period = round_period_s(result)
    notice_wire = costs["notice_bytes"] + costs["stream_overhead_bytes"]
    dht = dht_keys_per_round(result)
    shuffles = 2 * period / proto.shuffle_s if proto.shuffle_s else 0.0  # started and answered
    shuffle_cards = shuffles * proto.shuffle_len
    ttl = round_ttl_s(sc.deadline_s)
    # a roster card is re-signed every ttl / 4 and checked when a read finds it new: once a re-sign, or
    # once a pass over the shards where a pass takes longer
    pass_s = roster_read_s(result) * ROSTER_SHARDS / proto.roster_keys_read
    roster_cards = ROSTER_SHARDS * cards_per_shard(sc.nodes)
    card_checks = shuffle_cards + roster_cards * period / max(ttl / ANNOUNCES_PER_TTL, pass_s)
    servers = max(sc.nodes * (1 - nat_share), 1)
    served_keys = (dht["keys_read"] + dht["keys_stored"] * DHT_REPLICAS) * sc.dht_hops() * sc.nodes / servers
    pulled = n.get("bytes_in", 0.0)
    out = {
        "payload_bytes_in": pulled,
        "payload_bytes_out": pulled,  # a node serves, on average, what a node pulls (authors serve)
        "notice_bytes_out": n["notices_sent"] * notice_wire,
        "notice_bytes_in": n["notices_received"] * notice_wire,
        "dht_bytes_in": dht["cards_read"] * costs["card_bytes"]
        + dht["announcements_read"] * costs["announcement_bytes"]
        + dht["keys_read"] * costs["dht_key_request_bytes"],
        "dht_bytes_out": dht["keys_stored"] * DHT_REPLICAS * costs["card_bytes"],
        "shuffle_bytes": shuffle_cards * costs["card_bytes"] * 2,
    }
    out["bytes_total"] = sum(out.values())
    stream = costs["notice_stream_cpu_s"] / 2  # the measured figure is both ends together
    cpu = {
        "cpu_publish_s": costs[f"publish_s_{batch_label(sc.batch_bytes, costs)}"],
        "cpu_notices_s": n["notices_sent"] * (stream + costs["notice_encode_s"])
        + n["notices_received"] * stream
        + n.get("announcement_checks", 0.0) * costs["announcement_check_s"],
        "cpu_pulls_s": (n.get("pulls", 0.0) + pulled / sc.batch_bytes) * costs["pull_stream_cpu_s"] / 2,
        "cpu_verify_s": n.get("verifications", 0.0) * sc.verify_s,
        "cpu_cards_s": card_checks * costs["card_check_s"],
        "cpu_dht_s": (dht["keys_read"] + dht["keys_stored"])
        * (costs["dht_key_cpu_s"] - costs["dht_key_server_cpu_s"])
        + served_keys * costs["dht_key_server_cpu_s"],
    }
    cpu["cpu_total_s"] = sum(cpu.values())
    return out | cpu | {"round_period_s": period}


def batch_label(batch_bytes: float, costs: Costs) -> str:
    """ "tiny" or "public": the measured batch size nearest this scenario's."""
    return min(("tiny", "public"), key=lambda k: abs(costs[f"batch_bytes_{k}"] - batch_bytes))


def bootstrap_load(result: Result, costs: Costs, nat_share: float = 0.0) -> dict[str, float]:
    """The bootstrap nodes this swarm needs and why (see the module docstring for the model)."""
    sc, proto = result.scenario, result.protocol
    dht = dht_keys_per_round(result)
    period = round_period_s(result)
    servers_without = max(sc.nodes * (1 - nat_share), 1.0)
    lookups_per_s = sc.nodes * (dht["keys_read"] + dht["keys_stored"] * DHT_REPLICAS) / period
    per_server = lookups_per_s * sc.dht_hops() / servers_without  # key answers a second, each DHT server
    capacity = BOOTSTRAP_UTILIZATION / costs["dht_key_server_cpu_s"]
    joins_per_s = sc.churn_per_min * sc.nodes / 60
    members = min(sc.nodes - 1, proto.view if proto.gossip else proto.roster_cap)
    join_keys = 2 + proto.roster_keys_first + min(proto.poll_keys, members) + 2
    spare = capacity - per_server
    by_dht = math.inf if spare <= 0 else math.ceil(joins_per_s * join_keys / spare)
    by_relay = math.ceil(sc.nodes * nat_share / RELAY_MAX_RESERVATIONS)
    shard_reads = sc.nodes / roster_read_s(result) * proto.roster_keys_read  # a second, over the shards
    hot_reads = shard_reads / ROSTER_SHARDS / DHT_REPLICAS
    costs_now = per_node_costs(result, costs, nat_share)
    relayed = costs_now["notice_bytes_in"] + costs_now["payload_bytes_out"]  # streams opened to a NAT node
    return {
        "joins_per_s": joins_per_s,
        "join_keys": join_keys,
        "dht_key_answers_per_s_per_server": per_server,
        "bootstrap_capacity_keys_per_s": capacity,
        "bootstraps_for_dht": by_dht,
        "bootstraps_for_relays": by_relay,
        "bootstraps": max(MIN_BOOTSTRAPS, by_dht, by_relay),
        "relay_bytes_per_s_per_bootstrap": relayed / period * RELAY_MAX_RESERVATIONS if by_relay else 0.0,
        "hot_key_reads_per_s_per_replica": hot_reads,
        "hot_key_bytes_per_s_per_replica": hot_reads * cards_per_shard(sc.nodes) * costs["card_bytes"],
    }
