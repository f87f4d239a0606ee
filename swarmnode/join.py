"""Swarm start-up around the node's lifecycle: what ``swarmnode join`` adds to a ``Node``.

``run_join`` sets up a ``Node`` (node.py), derives this start's network settings from the run folder
(``rejoin_network``: the previous port and peers after a restart), loads or mints the identity's proof of
work (``identity_work``: its roster card carries it), starts the ``Swarm`` and falls back to a first start
when none of the saved peers answers (``_start_swarm``), prints the join hint, waits for the peers the
config asks for, then runs the node's rounds with the swarm's exchange as the hook, keeping
``known_peers.json`` up to date (``KnownPeersWriter``). On the way out the swarm shuts down (an offline
card, then the network) before the node closes.

Separate from node.py so that the node's lifecycle stays the same for solo and swarm nodes and knows
nothing of the network: node.py never imports this module (join imports node, not the reverse); the
node's one seam for the network is ``Node.run``'s ``exchange`` and ``peer_counts`` hooks, and the
``Swarm`` is handed the parts it uses (identity, task bank, policy, run folder), never the node.
hivemind and the network stack are imported inside the functions, only when a swarm node starts.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from swarmnode.common import log
from swarmnode.config import NodeConfig, SwarmConfig
from swarmnode.errors import TransportError
from swarmnode.identity_work import load_or_mint_work
from swarmnode.node import Node
from swarmnode.run_folder import (
    KNOWN_PEERS_FILE,
    MAX_KNOWN_PEERS,
    KnownPeers,
    load_known_peers,
    save_known_peers,
)


def join_command(addr: str, swarm_id: str, config_path: Path | None) -> str:
    """What a joiner pastes to join this node's swarm: its address, and the swarm id and config file
    without which the joiner would land in the default swarm (or another task mix) and train alone."""
    config = f" --config {shlex.quote(str(config_path))}" if config_path is not None else ""
    return f"swarmnode join --peers {addr}{config} --set swarm.swarm_id={swarm_id}"


def rejoin_network(swarm: SwarmConfig, known: KnownPeers | None) -> tuple[SwarmConfig, bool]:
    """This start's network settings after a restart: the previous listen port where the config leaves
    the port to chance (port 0) and it is free again, and the previous peers where the config names none
    (explicit --peers are used alone: docs/operators.md). Returns (settings, whether saved peers are dialed).
    """
    from swarmnode.swarm.net.daemon import check_initial_peers, check_listen_ports

    if known is None:
        return swarm, False
    update: dict = {}
    port_left_to_chance = bool(swarm.host_maddrs) and all(
        maddr.rstrip("/").endswith("/tcp/0") for maddr in swarm.host_maddrs
    )
    if known.port is not None and port_left_to_chance and not swarm.announce_maddrs:
        previous = [maddr.rstrip("/").removesuffix("/0") + f"/{known.port}" for maddr in swarm.host_maddrs]
        try:
            check_listen_ports(previous)
            update["host_maddrs"] = previous
        except TransportError:
            log(f"the previous listen port {known.port} is taken: listening on a new one")
    saved = []
    for addr in known.peers:  # a file edited by hand must not stop the start: unparsable ones are dropped
        try:
            saved += check_initial_peers([addr], own_peer_id="")
        except TransportError:
            continue
    dial_saved = not swarm.initial_peers and bool(saved)
    if dial_saved:
        update["initial_peers"] = saved
        log(f"dialing {len(saved)} peer(s) this node knew when it last ran ({KNOWN_PEERS_FILE})")
    return swarm.model_copy(update=update), dial_saved


class KnownPeersWriter:
    """Keeps ``known_peers.json`` up to date from the roster: written when the peers' addresses change
    (checked once per round, not per poll), one address per peer, at most MAX_KNOWN_PEERS."""

    def __init__(self, run_dir: Path, port: int | None):
        self.run_dir, self.port = run_dir, port
        self.saved: KnownPeers | None = None

    def update(self, roster: dict) -> None:
        peers = []
        for card in list(roster.values())[-MAX_KNOWN_PEERS:]:  # the most recently joined are kept
            direct = [addr for addr in card.addrs if "p2p-circuit" not in addr and "/p2p/" in addr]
            peers.extend(direct[:1])
        known = KnownPeers(self.port, tuple(peers))
        if known != self.saved:
            try:
                save_known_peers(self.run_dir, known)
                self.saved = known
            except OSError as exc:  # a full disk costs the restart its shortcut, not the run
                log(f"could not save {KNOWN_PEERS_FILE} ({exc}); a restart may not find the swarm")


def _start_swarm(node: Node, cfg: NodeConfig):
    """Make and start this node's Swarm: on the previous port and through the previous peers after a
    restart (``rejoin_network``); if none of those peers answers, as on a first start, said in one line.
    Returns (swarm, its addresses)."""
    from swarmnode.swarm.exchange.swarm import Swarm  # hivemind and the network stack only for swarm nodes

    # before the network starts: the card needs the identity's proof (minted once per key, then kept)
    work_nonce = load_or_mint_work(node.identity, node.identity_path, cfg.swarm.identity_work_bits)

    def start(settings: SwarmConfig):
        swarm = Swarm(
            cfg.model_copy(update={"swarm": settings}),
            identity=node.identity,
            bank=node.bank,
            policy=node.policy,
            identity_path=node.identity_path,
            run_dir=node.run_dir,
            on_status=node.metrics.observe_swarm,
            work_nonce=work_nonce,
        )
        try:
            return swarm, swarm.start(node.completed_rounds, node.trainer.policy_version)
        except BaseException:
            swarm.shutdown()
            raise

    settings, dial_saved = rejoin_network(cfg.swarm, load_known_peers(node.run_dir))
    try:
        return start(settings)
    except TransportError as exc:
        if not (dial_saved and exc.reason == "unreachable"):
            raise
        tried = len(settings.initial_peers)
        log(f"none of the {tried} saved peer(s) answered: this node starts a new swarm, as on a first start")
        return start(cfg.swarm)


def run_join(cfg: NodeConfig, config_path: Path | None = None) -> None:
    """Join a swarm: start the transport (``_start_swarm``), print how others join through this node, wait
    for the peers the config asks for, then run rounds that share rollouts, keeping ``known_peers.json``
    up to date. The swarm shuts down on the way out (an offline card, then the network).
    ``config_path``: the YAML the node was started with, named in the join hint."""
    from swarmnode.swarm.net.reachability import tcp_ports

    node = Node(cfg)
    swarm = known = None

    def roster() -> dict:
        return swarm.roster.cards_now()  # a copy: the exchange service updates it from its own thread

    try:
        swarm, addrs = _start_swarm(node, cfg)
        known = KnownPeersWriter(node.run_dir, next(iter(tcp_ports(addrs)), None))
        log(f"swarm {cfg.swarm.swarm_id}: peer id {node.peer_id}")
        log(f"reachability: {swarm.transport.reachability_note}")
        if swarm.transport.client_mode:  # peers cannot dial it (NAT, firewall): its own addresses fail
            log("peers cannot dial this node; others join through the peers it joined through:")
            hints = list(cfg.swarm.initial_peers)
        else:
            log("others can join through this node with:")
            hints = [addr for addr in addrs if "/p2p-circuit" not in addr]  # relayed: refused as a peer
        for addr in hints:
            log(f"  {join_command(addr, cfg.swarm.swarm_id, config_path)}")
        swarm.wait_for_peers()
        known.update(roster())

        def exchange(round_: int, local: list) -> list:
            chosen = swarm.exchange(round_, node.trainer.policy_version, local)
            known.update(roster())
            return chosen

        node.run(exchange=exchange, peer_counts=swarm.round_counts, on_trained=swarm.credit_trained)
    except KeyboardInterrupt:  # Ctrl-C before the rounds (waiting for peers) is a stop on purpose too
        node.stopped_cleanly = True
        raise
    finally:
        if known is not None:
            known.update(roster())
        if swarm is not None:
            swarm.shutdown()
        node.close()
