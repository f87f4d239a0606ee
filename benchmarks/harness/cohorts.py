"""Whether a loopback swarm run was one swarm or split into cohorts, from its run folders' traces.

At 32 nodes on one machine a swarm once split in two in time: 17 nodes' roster reads timed out, they
waited out ``wait_for_peers_s`` and ran their rounds a wait later than the rest, each half training on
itself. Two views of the same question, both from what benchmarks.swarm_latency already reads:

- **in time**: in each round, the nodes' publish starts sorted; a gap longer than the median round splits
  them (nodes of different speeds drift apart by parts of a round; a cohort that waited out a start is
  many rounds behind). One cohort: no round has such a gap.
- **in what they trained on**: the graph with an edge between a node and each producer of a peer group
  it trained on; one cohort: the graph is connected (every node reached from every other, ignoring
  direction).
"""

from __future__ import annotations

import itertools
import statistics


def time_cohorts(starts: list[float], round_s: float) -> int:
    """How many groups ``starts`` (one round's publish starts) fall into, split at gaps > ``round_s``."""
    ordered = sorted(starts)
    return 1 + sum(b - a > round_s for a, b in itertools.pairwise(ordered)) if ordered else 0


def trained_components(peers: list[str], trained_from: dict[str, set[str]]) -> int:
    """Connected components of the undirected graph "trained on a group of": ``trained_from`` maps a
    peer to the producers it trained on (producers outside ``peers`` are left out)."""
    neighbours: dict[str, set[str]] = {peer: set() for peer in peers}
    for peer, producers in trained_from.items():
        for producer in producers & neighbours.keys():
            neighbours[peer].add(producer)
            neighbours[producer].add(peer)
    seen: set[str] = set()
    components = 0
    for peer in peers:
        if peer in seen:
            continue
        components += 1
        stack = [peer]
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                stack.extend(neighbours[node] - seen)
    return components


def cohorts(nodes: list[dict], first: int, last: int) -> dict:
    """Rounds ``first``..``last`` of swarm_latency's per-node dicts (``peer``, ``publish`` by round with
    ``started``, ``metrics`` by round with ``seconds_total``, ``trained`` (producer, round) pairs): the
    largest number of time cohorts in any round, and the trained-on graph's components."""
    round_s = statistics.median(
        [node["metrics"][r]["seconds_total"] for node in nodes for r in range(first, last + 1)
         if r in node["metrics"]] or [float("inf")]
    )  # fmt: skip
    in_time = max(
        (
            time_cohorts([n["publish"][r]["started"] for n in nodes if r in n["publish"]], round_s)
            for r in range(first, last + 1)
        ),
        default=0,
    )
    trained_from = {
        node["peer"]: {producer for producer, r in node["trained"] if first <= r <= last} for node in nodes
    }
    return {
        "time_cohorts": in_time,
        "trained_components": trained_components([node["peer"] for node in nodes], trained_from),
    }
