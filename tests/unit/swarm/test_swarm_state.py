"""What a swarm node remembers about its peers' traffic stays bounded, however long it runs.

Regression for the security review: the set of pulled payload digests, the retry counters and the peers
ignored for a bad roster card grew by one entry per announcement forever (a peer announcing a new
payload every poll grew them without limit); they now live in ``common.BoundedSet``s.
"""

from __future__ import annotations

from swarmnode.common import BoundedSet
from swarmnode.swarm import exchange


def test_bounded_set_keeps_the_newest_keys_up_to_the_cap():
    seen: BoundedSet[int] = BoundedSet(4)
    for key in range(10):
        seen.add(key)
    assert list(seen) == [6, 7, 8, 9]
    seen.add(7)  # a key seen again keeps its place: eviction stays oldest-first
    seen.add(10)
    assert list(seen) == [7, 8, 9, 10]


def test_failed_pulls_leave_no_retry_counter_behind(tmp_path):
    """A payload whose pulls keep failing is retried MAX_FETCH_ATTEMPTS times, then forgotten entirely."""
    from types import SimpleNamespace

    from swarmnode.config import NodeConfig, TasksConfig, TaskSpec
    from swarmnode.identity import Identity
    from swarmnode.swarm import protocol
    from swarmnode.tasks import TaskBank

    identity = Identity.generate()
    node = exchange.Swarm(
        NodeConfig(),
        identity=identity,
        bank=TaskBank(TasksConfig(mix={"basic_arithmetic": TaskSpec()}, seed=1)),
        policy=SimpleNamespace(name="tiny", tokenizer_fingerprint="", tokenizer=range(512)),
        identity_path=tmp_path / "identity.key",
        run_dir=tmp_path,
    )  # not started: only its bookkeeping is exercised
    peer = Identity.generate().peer_id
    for i in range(100):
        announcement = protocol.BatchAnnouncement(
            peer_id=peer, swarm_id=node.swarm_id, round=i, policy_version=0, payload_sha256=bytes([i]) * 32,
            payload_len=10, n_groups=1, timestamp=0.0, seq=i,
        )  # fmt: skip
        for _ in range(exchange.MAX_FETCH_ATTEMPTS):
            node._after_failed_fetch(peer, announcement, "timeout")
    assert len(node._fetch_attempts) == 0
