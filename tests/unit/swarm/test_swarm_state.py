"""What a swarm node remembers about its peers' traffic stays bounded, however long it runs.

Regression for the security review: the set of pulled payload digests, the retry counters and the peers
ignored for a bad roster card grew by one entry per announcement forever (a peer announcing a new
payload every poll grew them without limit); they now live in ``common.BoundedSet``s (the exchange
service's pending batches and back-offs: tests/unit/swarm/test_background.py).
"""

from __future__ import annotations

from swarmnode.common import BoundedSet


def test_bounded_set_keeps_the_newest_keys_up_to_the_cap():
    seen: BoundedSet[int] = BoundedSet(4)
    for key in range(10):
        seen.add(key)
    assert list(seen) == [6, 7, 8, 9]
    seen.add(7)  # a key seen again keeps its place: eviction stays oldest-first
    seen.add(10)
    assert list(seen) == [7, 8, 9, 10]
