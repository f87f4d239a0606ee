"""The checks of a node's start that need no model: ports to bind, addresses to parse, and who answers at
each initial peer's address. The CLI runs them before it imports the node (torch, transformers, the DHT),
so that such a mistake ends in one line within seconds, not after the model has loaded. The node checks
ports and addresses again where it uses them (a port can be taken in between).

Core layer: imports config, errors, metrics_server, ``swarm.net.daemon``'s parsers and (for initial peers
only) hivemind's p2p daemon client.
"""

from __future__ import annotations

import re

from swarmnode.common import log
from swarmnode.config import NodeConfig
from swarmnode.errors import ConfigError, TransportError
from swarmnode.metrics_server import check_metrics_port

PEER_CHECK_S = 3.0  # how long every initial peer together gets to answer the handshake
# go-libp2p's words when the key at an address is not the one its /p2p/ part names
_MISMATCH = re.compile(r"peer id mismatch: expected \w+, but remote key matches (\w+)")


def check_start(cfg: NodeConfig, *, swarm: bool) -> None:
    """Raise the user's one-line error for a taken metrics port, and for a swarm node a taken or foreign
    listen address (``swarm.host_maddrs``), an initial peer address that does not parse, or initial peers
    of which none answers as the peer its address names (``check_peer_ids``)."""
    if cfg.run.metrics_port:  # 0: any free port; None: no metrics
        check_metrics_port(cfg.run.metrics_host, cfg.run.metrics_port)
    if not swarm:
        return
    from swarmnode.swarm.net.daemon import check_initial_peers, check_listen_ports

    for field, check in (
        ("host_maddrs", lambda: check_listen_ports(cfg.swarm.host_maddrs)),
        ("initial_peers", lambda: check_initial_peers(cfg.swarm.initial_peers, own_peer_id="")),
    ):
        try:
            check()
        except TransportError as exc:
            raise ConfigError(f"swarm.{field}: {str(exc).removeprefix(exc.reason + ': ')}") from None
    check_peer_ids(cfg.swarm.initial_peers)


def check_peer_ids(addrs: list[str]) -> None:
    """Dial each initial peer as the peer its ``/p2p/`` part names. When none is that peer and some other
    peer answered (a node with a new identity, an id pasted from another node), raise a ConfigError naming
    the id that answered; when some are right, say the wrong ones in a line and go on. When nothing
    answers at any address, say so in a line and go on: the DHT start tries them again (a bootstrap
    started at the same moment may not be up yet) and ends in its own error if they stay silent."""
    answers = _answering_peers(addrs) if addrs else {}
    if answers and all(found is None for found in answers.values()):
        log(
            f"swarm.initial_peers: nothing answers yet at {', '.join(addrs)} (asked for "
            f"{PEER_CHECK_S:.0f} s); the node tries again as it starts and stops if none answers"
        )
        return
    wrong = {addr: found for addr, found in answers.items() if found not in (None, _claimed(addr))}
    if not wrong:
        return
    said = "; ".join(
        f"{addr} is answered by peer {found}, not {_claimed(addr)}: use "
        f"{addr.rsplit('/p2p/', 1)[0]}/p2p/{found} if that is the node you mean"
        for addr, found in wrong.items()
    )
    if any(found == _claimed(addr) for addr, found in answers.items()):
        log(f"swarm.initial_peers: {said}")
        return
    raise ConfigError(f"swarm.initial_peers: {said}")


def _claimed(addr: str) -> str:
    return addr.rsplit("/p2p/", 1)[1]


def _answering_peers(addrs: list[str]) -> dict[str, str | None]:
    """addr -> the peer id whose key answered the libp2p handshake at its transport address (the claimed
    id when it is that peer), or None when nothing answered within PEER_CHECK_S; one throwaway daemon
    (a random key, no listening address) dials them all at once."""
    import asyncio

    from hivemind.p2p import P2P, PeerID
    from hivemind.utils.multiaddr import Multiaddr

    async def ask(p2p: P2P, addr: str) -> str | None:
        claimed = _claimed(addr)
        transport = Multiaddr(addr).decapsulate(Multiaddr(f"/p2p/{claimed}"))
        try:  # hivemind's P2P has no public connect; its DHT dials through the same daemon client
            await asyncio.wait_for(
                p2p._client.connect(PeerID.from_base58(claimed), [transport]), PEER_CHECK_S
            )
            return claimed
        except Exception as exc:  # refused, timed out, or answered by another key
            found = _MISMATCH.search(str(exc))
            return found.group(1) if found else None

    async def ask_all() -> dict[str, str | None]:
        p2p = await P2P.create(host_maddrs=[])
        try:
            return dict(zip(addrs, await asyncio.gather(*(ask(p2p, addr) for addr in addrs)), strict=True))
        finally:
            await p2p.shutdown()

    return asyncio.run(ask_all())
