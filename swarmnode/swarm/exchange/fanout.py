"""Whom a publish notifies: NOTICE_FANOUT peers on a ring, so every node hears of as many batches.

A node pulls at most K = 2 J batches a round (exchange/puller.py), the first it hears of, so the batches
it trains on are the ones it hears of first: by notice at once, or by the DHT poll seconds later (the
announcement's store, then the poll's period). Random notice targets give a node 8 notices a round on
average but 4 or fewer in some rounds, and the rest of its budget then goes to batches found by the poll:
measured at 16 nodes, the batches nodes trained on reached them 5.3 s after publishing at p95, with 32%
found by the poll (docs/scaling.md).

So the targets are a circulant graph: the peers with standing and this node form a ring; this node
notifies the NOTICE_FANOUT peers after it. Every node that sees the same ring then receives exactly
NOTICE_FANOUT notices per publish wave. The ring's order is ``ring_position``, a hash of (peer id, epoch),
the epoch being the wall-clock minute (NOTICE_ROTATION_S; clocks agree within seconds: PROTOCOL.md,
lifetimes): each minute the ring is a new random order, so the publishers a node hears from change every
minute (experience mixes across the swarm), and no peer id can be chosen for a lasting place: on a ring
by raw peer id, keys made to sort just below a victim are its only senders whenever the offsets reach
them. Keys ground against the hash hold their places for the one minute ground against; each minute needs
keys of its own, each with its identity work and standing (docs/reliability.md). Peers without standing
are not on the ring (an identity costs its proof of work, not its place in others' pushes); they fill the
targets only while fewer peers with standing are known, in a new random order each time.

The ring alone is not enough once nodes choose whom to train on by what they measured (exchange/pool.py):
a node trains on the peers it scores highest, and this minute's ring rarely makes those its senders, so
their batches reached it by the poll, seconds late (16 nodes: the batches trained on, 83% found by notice,
used-by p95 4.0 s; notices to every peer: 100%, 0.91 s; docs/scaling.md). So a publish also notifies up to
PULLER_NOTICES of the peers that pulled this node's last batches (``with_pullers``; the payload server
measured them: net/payloads.py), peers with standing first. A Sybil that pulls to be notified takes one of
those places at most and costs the node one notice; an honest puller left out finds the batch by the poll,
as before.
"""

from __future__ import annotations

import hashlib
import random
import time

# peers a new batch's notice is pushed to; the others find it at their DHT poll. K (8 at J = 4) and two
# spare, since nodes' rings differ while standing spreads: at 16 nodes on loopback, the batches nodes
# trained on reached them in 2.46 s at p95 with 8, 1.46 s with 10 (docs/scaling.md)
NOTICE_FANOUT = 10
PULLER_NOTICES = NOTICE_FANOUT // 2  # more notices a publish sends, to its last batches' pullers off the ring
NOTICE_ROTATION_S = 60.0  # the ring's order changes this often (its epoch)
RING_DOMAIN = b"swarmnode notice ring v1"


def ring_position(peer_id: str, epoch: int) -> bytes:
    """Where ``peer_id`` sits on the ring in ``epoch``: sha256(RING_DOMAIN || epoch as 8 bytes big-endian ||
    peer id in UTF-8). A new independent order every epoch: a key's place in one tells nothing of the next."""
    return hashlib.sha256(
        RING_DOMAIN + epoch.to_bytes(8, "big", signed=True) + peer_id.encode("utf-8", "surrogatepass")
    ).digest()


def notice_targets(
    own: str,
    standing: list[str],
    others: list[str],
    count: int = NOTICE_FANOUT,
    now: float | None = None,
) -> list[str]:
    """``count`` peers to notify: the next ones after ``own`` on this epoch's ring of ``standing`` peers and
    ``own`` (module docstring), then ``others`` (peers without standing) at random while the ring has
    fewer."""
    epoch = int((time.time() if now is None else now) // NOTICE_ROTATION_S)
    ring = sorted({*standing, own}, key=lambda peer: (ring_position(peer, epoch), peer))
    n = len(ring)
    position = ring.index(own)
    targets = [ring[(position + j) % n] for j in range(1, min(count, n - 1) + 1)]
    rest = [peer for peer in others if peer != own]
    random.shuffle(rest)
    return targets + rest[: count - len(targets)]


def with_pullers(targets: list[str], pullers: list[str], count: int = PULLER_NOTICES) -> list[str]:
    """``targets``, then the first ``count`` of ``pullers`` (in the order given) not among them."""
    chosen = set(targets)
    return targets + [peer for peer in dict.fromkeys(pullers) if peer not in chosen][:count]
