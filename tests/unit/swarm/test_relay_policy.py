"""The relay policy p2pd starts with (swarm.daemon): static relays for a node behind NAT, named limits on
what serving as a relay costs, and relayed addresses kept away from hivemind's initial-peer parsing."""

import asyncio
from pathlib import Path

import pytest

from swarmnode.errors import TransportError
from swarmnode.swarm.net import daemon

RELAY = "/ip4/11.0.0.1/tcp/31337/p2p/12D3KooWEFeDz6qsnuvAt36i5CcAFDUiyRk2aEhYu5wC7dVsFrGr"


def test_trusted_relays_turn_discovery_off_and_the_relay_limits_are_ours():
    args = daemon.relay_policy_args({"relay": True, "autoRelay": True, "trustedRelays": RELAY})
    assert args["relayDiscovery"] is False  # static relays: a slot at once, not after 3 minutes
    assert args["relayMaxReservations"] == daemon.RELAY_MAX_RESERVATIONS
    assert args["relayMaxCircuits"] == daemon.RELAY_MAX_CIRCUITS_PER_PEER
    assert args["relayBufferSize"] == daemon.RELAY_BUFFER_BYTES
    assert args["relayDataLimit"] == daemon.RELAY_DATA_LIMIT_BYTES
    assert args["relayTimeLimit"] == f"{daemon.RELAY_TIME_LIMIT_S}s"
    public = daemon.relay_policy_args({"relay": True, "forceReachabilityPublic": 1})
    assert "relayDiscovery" not in public and public["relayBufferSize"] == daemon.RELAY_BUFFER_BYTES
    assert daemon.relay_policy_args({"relay": False}) == {"relay": False}


def test_a_real_p2pd_accepts_the_policy_flags():
    """p2pd exits on a flag it does not know: start one with every flag of the policy and read them back."""
    from hivemind.p2p import P2P

    daemon.install_relay_policy()
    daemon.install_relay_policy()  # twice: wrapped once

    async def start_and_read_cmdline() -> list[str]:
        p2p = await P2P.create(use_auto_relay=True, trusted_relays=[RELAY], force_reachability="private")
        try:
            return Path(f"/proc/{p2p._child.pid}/cmdline").read_bytes().decode().split("\0")
        finally:
            await p2p.shutdown()

    cmdline = asyncio.run(asyncio.wait_for(start_and_read_cmdline(), 30))
    assert "-relayDiscovery=0" in cmdline
    assert f"-relayBufferSize={daemon.RELAY_BUFFER_BYTES}" in cmdline
    assert sum(arg.startswith("-relayBufferSize") for arg in cmdline) == 1


def test_a_relayed_initial_peer_is_refused_with_what_to_give_instead():
    with pytest.raises(TransportError, match="relayed .* direct address") as err:
        daemon.check_initial_peers([f"{RELAY}/p2p-circuit/p2p/12D3KooWTarget"], "12D3KooWSelf")
    assert err.value.reason == "bad_address"
