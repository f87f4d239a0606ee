"""The poisoning attacker as a process of its own, against a real ``swarmnode join`` node (``live`` starts
it; ``peer.Attacker`` writes what it sends, as in the harness without a network).

    python -m benchmarks.poisoning.live_host WORK_DIR SWARM_ID INITIAL SPEC_JSON

SPEC_JSON: the arm (``run.ArmSpec``'s fields) as ``live`` runs it. One libp2p host
(``reliability.sybils.start_host``) speaks for the attacker identities, each minted at the swarm's identity
work: it stores their roster cards in the DHT every CARD_REFRESH_S and, each time the node begins a round
(its batch announcement names a newer round), publishes one batch per identity for that round, offered on
the host and announced by notice to the node (the host is the only holder: an announcement found by the
DHT poll would name the identity, which has no address). A fluent payload is planned on the attacker's own
copy of the public base model (``run.make_planner``), as in the harness without a network.

Output: ``READY {json}`` once the host is up and the first cards are stored, ``PUBLISHED {json}`` per round
(groups sent and notices taken). It stops on SIGTERM (its host shut down) or after LIFETIME_S.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

from benchmarks.poisoning import payloads
from benchmarks.poisoning.peer import Attacker, attacker_identity
from benchmarks.poisoning.run import ArmSpec, make_planner
from benchmarks.reliability import sybils

CARD_REFRESH_S = 10.0
POLL_S = 0.5  # how often the node's announcement is read
LIFETIME_S = 6 * 3600.0


def node_round(transport, swarm_id: str, node: str) -> int | None:
    """The round of the node's newest batch announcement in the DHT (None: none yet, or unreadable)."""
    from swarmnode.swarm.net import dht
    from swarmnode.swarm.wire import codec, limits

    for record, author in dht.read_announcements(transport.records, swarm_id, [node], sybils.STORE_TIMEOUT_S):
        try:
            message, _ = codec.decode_message(
                record, swarm_id=swarm_id, expected_type=limits.BATCH_ANNOUNCEMENT, expected_peer_id=author
            )
        except limits.ProtocolError:
            return None
        return message.round
    return None


def build(spec: ArmSpec, swarm_id: str) -> tuple[object, Attacker, list[sybils.Sybil]]:
    """The arm's config in swarm ``swarm_id``, its attacker (with a planner for a fluent payload,
    ``run.make_planner``) and the identities' Sybils (minted at the swarm's identity work)."""
    from swarmnode.config import load_config
    from swarmnode.policy import load_policy
    from swarmnode.swarm.wire import work
    from swarmnode.tasks import TaskBank

    cfg = load_config(spec.config, {**spec.overrides(), "swarm.swarm_id": swarm_id})
    policy = load_policy(cfg.model, seed=cfg.train.seed)
    bank = TaskBank(cfg.tasks, default_seed=cfg.tasks.seed)
    fluent = spec.payload in payloads.FLUENT_KINDS
    planner = make_planner(spec, cfg, bank, policy) if fluent and not spec.control else None
    signers = []
    for index in range(spec.attackers):
        identity = attacker_identity(spec.seed, index)
        signers.append(sybils.Sybil(identity, work.mint(identity.public_key, cfg.swarm.identity_work_bits)))
    attacker = Attacker(
        cfg, bank, policy, payload=None if spec.control else spec.payload, seed=spec.seed,
        identities=spec.attackers, planner=planner, node_style=fluent, signers=signers,
    )  # fmt: skip
    return cfg, attacker, signers


def main(argv: list[str]) -> None:
    from swarmnode.swarm.net.payloads import PayloadServer
    from swarmnode.swarm.wire import limits
    from swarmnode.tasks import TaskBank

    work_dir, swarm_id, initial, fields = Path(argv[0]), argv[1], argv[2], json.loads(argv[3])
    node = initial.rsplit("/p2p/", 1)[1]
    cfg, attacker, signers = build(ArmSpec(**{**fields, "sets": tuple(fields["sets"])}), swarm_id)
    fingerprint = TaskBank(cfg.tasks, default_seed=0).fingerprint  # what the node's roster card carries
    server = PayloadServer(payload_capacity=64)
    host = sybils.start_host(
        work_dir / "host.key", swarm_id, initial, cfg.swarm.identity_work_bits, payloads=server
    )
    closed = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: closed.set())  # the driver's stop: shut the host down cleanly
    try:

        def store_cards() -> int:
            return sum(
                sybils.send(host, swarm_id, s, s.card(swarm_id, fingerprint, cfg.model.name)) for s in signers
            )

        print(
            "READY " + json.dumps({"peers": attacker.peer_ids, "host": host.peer_id, "cards": store_cards()}),
            flush=True,
        )
        published, cards_at, end = -1, time.monotonic(), time.monotonic() + LIFETIME_S
        while not closed.is_set() and time.monotonic() < end:
            if time.monotonic() - cards_at > CARD_REFRESH_S:
                store_cards()
                cards_at = time.monotonic()
            round_ = node_round(host, swarm_id, node)
            if round_ is not None and round_ > published:
                taken, batches = 0, attacker.publish(round_)
                for signer, batch in zip(signers, batches, strict=True):
                    server.offer(limits.payload_digest(batch.data), batch.data)
                    card = signer.card(swarm_id, fingerprint, cfg.model.name)
                    taken += sybils.send(
                        host, swarm_id, signer, card, announcement=batch.record, notify=[node],
                        store_card=False, store_announcement=False,
                    )  # fmt: skip
                said = {
                    "round": round_,
                    "groups": sum(len(b.groups) for b in batches),
                    "notices_taken": taken,
                }
                print("PUBLISHED " + json.dumps(said), flush=True)
                published = round_
            closed.wait(POLL_S)
    finally:
        host.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
