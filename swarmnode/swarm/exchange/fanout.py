"""Whom a publish notifies (#27): NOTICE_FANOUT peers on a ring, so every node hears of as many batches.

A node pulls at most K = 2 J batches a round (exchange/puller.py), the first it hears of, so the batches
it trains on are the ones it hears of first: by notice at once, or by the DHT poll seconds later (the
announcement's store, then the poll's period). Random notice targets give a node 8 notices a round on
average but 4 or fewer in some rounds, and the rest of its budget then goes to batches found by the poll:
measured at 16 nodes, the batches nodes trained on reached them 5.3 s after publishing at p95, with 32%
found by the poll (docs/scaling.md).

So the targets are a circulant graph: the peers with standing and this node, sorted by peer id, form a
ring; this node notifies the peers at NOTICE_FANOUT distinct offsets after it, the offsets rotating once
every NOTICE_ROTATION_S of wall-clock time (clocks agree within seconds: PROTOCOL.md, lifetimes). Every
node that sees the same ring then receives exactly NOTICE_FANOUT notices per publish wave, from a set of
publishers that changes every rotation (experience mixes across the swarm). Peers without standing are
not on the ring (an identity costs its proof of work, not its place in others' pushes); they fill the
targets only while fewer peers with standing are known, in a new random order each time.
"""

from __future__ import annotations

import random
import time

# peers a new batch's notice is pushed to; the others find it at their DHT poll. K (8 at J = 4) and two
# spare, since nodes' rings differ while standing spreads: at 16 nodes on loopback, the batches nodes
# trained on reached them in 2.46 s at p95 with 8, 1.46 s with 10 (docs/scaling.md)
NOTICE_FANOUT = 10
NOTICE_ROTATION_S = 60.0  # the ring's offsets move on this often


def notice_targets(
    own: str,
    standing: list[str],
    others: list[str],
    count: int = NOTICE_FANOUT,
    now: float | None = None,
) -> list[str]:
    """``count`` peers to notify: on the ring of ``standing`` peers and ``own`` (module docstring), then
    ``others`` (peers without standing) at random while the ring has fewer."""
    ring = sorted({*standing, own})
    n = len(ring)
    epoch = int((time.time() if now is None else now) // NOTICE_ROTATION_S)
    position = ring.index(own)
    targets = [ring[(position + 1 + (epoch + j) % (n - 1)) % n] for j in range(min(count, n - 1))]
    rest = [peer for peer in others if peer != own]
    random.shuffle(rest)
    return targets + rest[: count - len(targets)]
