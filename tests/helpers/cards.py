"""A roster card with every field set, for the wire tests (protocol, identity work)."""

from __future__ import annotations

from swarmnode.identity import Identity
from swarmnode.swarm.wire import protocol


def roster_card(identity: Identity, swarm: str, **changes) -> protocol.RosterCard:
    """``identity``'s card in ``swarm``, fixed values for the rest (a timestamp of 2026-01-01), with
    ``changes`` applied."""
    fields = dict(
        peer_id=identity.peer_id,
        swarm_id=swarm,
        model_name="tiny-llama",
        tokenizer_fingerprint="ab" * 32,
        policy_version=3,
        round=5,
        addrs=("/ip4/127.0.0.1/tcp/4001",),
        timestamp=1767225600.5,
        seq=9,
    )
    return protocol.RosterCard(**{**fields, **changes})
