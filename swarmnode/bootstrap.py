"""`swarmnode bootstrap`: a DHT-only node that other nodes join through (no model, no training).

A bootstrap node is what a public network's config lists: it must keep one address for months, so it
listens on a fixed port and keeps its identity in a key file (the ``/p2p/`` part of its address). It joins
the other bootstraps of the config when they answer and starts alone when none does (the first one).
It runs with ``swarm.reachability=public``: it never checks itself, and go-libp2p then offers circuit relays
to client-mode nodes (they take their initial peers as static relays), within the relay-service limits that
``swarm.net.daemon`` sets (``RELAY_*``: 128 MiB of relay buffers at worst). Every node also answers the
dial-back check (reachability.py), so a bootstrap serves it too.

Metrics (``/metrics`` and ``/health``, same server as a node's): the DHT routing-table size, the records
it stores for the DHT, libp2p connections, the process collector, and ``swarmnode_dht_alive`` /
``swarmnode_health_ok``; ``/health`` is ``degraded`` (HTTP 503) when the DHT process is gone or does not
answer. ``/`` is its status page: health, connections (the first ``status_page.MAX_PAGE_PEERS`` peer ids)
and the DHT's size; a bootstrap serves any swarm and keeps no roster, so it shows none.

SIGINT and SIGTERM stop it cleanly: the DHT process and p2pd are shut down before it exits, with status 130
after Ctrl-C (a shell's convention) and 0 after SIGTERM (what systemd and ``docker stop`` count as a clean
stop; exit 143 would mark the unit failed). The DHT process runs in its own process group, so a terminal's
Ctrl-C, which signals the whole foreground group, reaches only this process: p2pd would otherwise die of it
before its orderly shutdown and log ``use of closed network connection``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

from swarmnode import __version__, status_page
from swarmnode.common import log
from swarmnode.config import NodeConfig
from swarmnode.identity import load_or_create
from swarmnode.metrics import dht_families
from swarmnode.metrics_server import MetricsServer
from swarmnode.swarm.net.transport import Transport


class BootstrapCollector:
    """The bootstrap's state, read from its DHT at scrape time (a cached value would miss short visits)."""

    def __init__(self, peer_id: str, transport: Transport):
        self.peer_id = peer_id
        self.transport = transport
        self.started = time.time()
        self._lock = threading.Lock()  # scrapes and the status line share the pipe to the DHT process

    def state(self) -> tuple[int, dict[str, int]]:
        """Connected peers and the DHT's stats (empty if the DHT process does not answer in time)."""
        with self._lock:
            return self.transport.connected_peer_count(), self.transport.dht_stats()

    def page(self) -> dict:
        """The status page's data: connections, the DHT's size and health (a bootstrap keeps no roster)."""
        with self._lock:
            peers, dht = self.transport.connected_peers(), self.transport.dht_stats()
        return status_page.bootstrap_page(self.peer_id, sorted(peers), dht, self._health(dht))

    def collect(self) -> Iterator:
        info = InfoMetricFamily("swarmnode_bootstrap", "This bootstrap node: peer id and version.")
        info.add_metric([], {"peer_id": self.peer_id, "version": __version__})
        yield info
        connected, dht = self.state()
        gauges = {
            "swarmnode_peers_connected": ("Peers with a libp2p connection.", connected),
            "swarmnode_dht_routing_table_peers": (
                "Peers in the DHT routing table.",
                dht.get("routing_table_peers"),
            ),
            "swarmnode_dht_stored_records": (
                "DHT keys this node stores for the swarm.",
                dht.get("stored_records"),
            ),
        }
        gauges["swarmnode_health_ok"] = ("1 when /health says ok, 0 when degraded.", not self._problems(dht))
        for name, (doc, value) in gauges.items():
            if value is not None:
                family = GaugeMetricFamily(name, doc)
                family.add_metric([], float(value))
                yield family
        yield from dht_families({"alive": self.transport.dht_alive()})

    def _problems(self, dht: dict) -> list[str]:
        """Why the bootstrap is degraded: its DHT process is gone, or does not answer."""
        if not self.transport.dht_alive():
            return ["the DHT process is not running"]
        return [] if dht else ["the DHT process does not answer"]

    def health(self) -> dict:
        return self._health(self.state()[1])

    def _health(self, dht: dict) -> dict:
        reasons = self._problems(dht)
        return {
            "status": "degraded" if reasons else "ok",
            "reasons": reasons,
            "role": "bootstrap",
            "uptime_s": round(time.time() - self.started, 1),
        }


_detach_forks = False  # True while run_bootstrap starts the DHT process (see _forks_in_own_group)
_fork_hook_registered = False


def _setpgid_in_child() -> None:
    if _detach_forks:
        os.setpgid(0, 0)


@contextmanager
def _forks_in_own_group() -> Iterator[None]:
    """Processes forked inside (hivemind's DHT process, and p2pd, which it starts) lead a process group of
    their own instead of joining the terminal's foreground group. They still end with this process: it shuts
    them down, and the DHT process exits by itself when its parent dies (swarm.daemon)."""
    global _detach_forks, _fork_hook_registered
    if not _fork_hook_registered:  # os.register_at_fork cannot be undone: register once, switch by flag
        os.register_at_fork(after_in_child=_setpgid_in_child)
        _fork_hook_registered = True
    _detach_forks = True
    try:
        yield
    finally:
        _detach_forks = False


def run_bootstrap(cfg: NodeConfig) -> int:
    """Run until SIGINT or SIGTERM; print how to join, then a status line every report period.
    Returns the exit status: 130 after SIGINT, 0 after SIGTERM."""
    boot = cfg.bootstrap
    identity, created = load_or_create(boot.identity_path)
    if created:
        log(f"created bootstrap identity {boot.identity_path} (peer id {identity.peer_id}); back it up")
    swarm = cfg.swarm.model_copy(
        update={"host_maddrs": boot.host_maddrs, "reachability": "public", "require_initial_peers": False}
    )
    transport = Transport(boot.identity_path, swarm, must_reach_initial_peers=False)
    stop = threading.Event()
    received: list[int] = []
    previous: dict = {}
    server = None

    def on_signal(signum: int, _frame) -> None:
        received.append(signum)
        stop.set()

    try:
        with _forks_in_own_group():
            addrs = transport.start()
        # only now: the DHT process is forked in start() and must keep the default SIGTERM, which is how
        # hivemind ends it when it does not stop in time
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
        collector = BootstrapCollector(identity.peer_id, transport)
        if boot.metrics_port is not None:
            server = MetricsServer(collector, boot.metrics_host, boot.metrics_port)
            log(f"metrics at {server.url}/metrics (health: {server.url}/health, status page: {server.url}/)")
        log(f"bootstrap node up: peer id {identity.peer_id}")
        log("nodes join through it with (list it under swarm.initial_peers):")
        for addr in addrs:
            log(f"  swarmnode join --peers {addr} --set swarm.swarm_id=<ID>")
        # a bootstrap is a DHT node of no swarm: it cannot tell joiners which swarm to join
        log("it serves any swarm: <ID> is the swarm's name, the same on every node of one swarm (and the "
            "same --config); without it a node joins the default swarm and may train alone")  # fmt: skip
        while not stop.wait(boot.report_every_s):
            connected, dht = collector.state()
            log(
                f"peers connected {connected}, routing table {dht.get('routing_table_peers', '?')}, "
                f"records {dht.get('stored_records', '?')}"
            )
        log("stopping the bootstrap node")
        return 130 if received[0] == signal.SIGINT else 0
    finally:
        if server is not None:
            server.close()
        transport.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
