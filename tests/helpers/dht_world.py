"""Honest transports and bare attacker DHTs that one test starts on 127.0.0.1, all stopped at its end
(the ``dht_world`` fixture: import it into a test module to use it)."""

from __future__ import annotations

from pathlib import Path

import hivemind
import pytest

from swarmnode.config import SwarmConfig
from swarmnode.identity import Identity
from swarmnode.swarm.net import daemon
from swarmnode.swarm.net.transport import Transport

WORK_BITS = 8  # the swarm's d in these tests: what its nodes ask of an identity (a mint is instant)


class DHTWorld:
    def __init__(self, tmp_path: Path, work_bits: int = WORK_BITS):
        self.tmp_path = tmp_path
        self.work_bits = work_bits
        self.transports: list[Transport] = []
        self.attackers: list[hivemind.DHT] = []

    def honest(
        self, name: str, swarm_id: str, initial: list[str], mode: str = "public"
    ) -> tuple[Transport, Identity, list[str]]:
        """A started transport of a fresh identity: (transport, identity, its addresses)."""
        identity = Identity.generate()
        path = self.tmp_path / f"{name}.key"
        identity.save(path)
        cfg = SwarmConfig(
            swarm_id=swarm_id, initial_peers=initial, reachability=mode, identity_work_bits=self.work_bits
        )
        transport = Transport(path, cfg)
        self.transports.append(transport)
        return transport, identity, transport.start()

    def attacker(self, initial: list[str], *, client: bool = True) -> hivemind.DHT:
        """A bare hivemind DHT that runs none of swarmnode's checks: it stores and asks what it likes."""
        attacker = hivemind.DHT(initial_peers=initial, client_mode=client, start=True)
        self.attackers.append(attacker)
        return attacker

    def close(self) -> None:
        for attacker in self.attackers:
            daemon.stop_dht_process(attacker)
        for transport in reversed(self.transports):
            transport.shutdown()


@pytest.fixture
def dht_world(tmp_path):
    world = DHTWorld(tmp_path)
    try:
        yield world
    finally:
        world.close()
