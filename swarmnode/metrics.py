"""Prometheus metrics, a health check and a status page for one node: ``/metrics``, ``/health`` and ``/``.

Each node has its own registry (several nodes can share a test process). Metrics are derived at scrape
time from the node's latest round record, its swarm status and its checkpoint time, through one custom
collector, so the round loop only hands over what it already computes. Names carry the ``swarmnode_``
prefix and unit suffixes. The server binds to 127.0.0.1 unless configured otherwise, and the node
writes a Prometheus file-discovery target (``<run_dir>/prometheus_target.json``) with its address, emptied
when the node stops cleanly (``retire_target``).

``/health`` answers ``{"status": "ok"}`` (HTTP 200) or ``{"status": "degraded", "reasons": [...]}`` (HTTP
503) when a check fails: no round for much longer than the last one took, the DHT process gone, no
successful DHT read or write for ``HEALTH_DHT_STALE_S``, or (swarm nodes) no peer in the roster. The same
verdict is exported as ``swarmnode_health_ok`` (with ``swarmnode_dht_alive``) for the alert rules. The server
answers each connection on its own thread (at most ``MAX_CONNECTIONS`` at once), one request each, and a
connection has ``REQUEST_DEADLINE_S`` in all to send its request and take the answer, however it trickles
its bytes; when every slot is taken, a new connection closes the oldest one still sending its request (a
scraper sends its request at once, so only a connection that has not is ever closed for another). So idle
or trickling clients, even ones that reconnect at once, cannot block a scrape.

``/`` is the status page for people (``status_page``: curves, peers, rejections, health), ``/page.json``
what it refreshes from; both read the node's run folder through a ``run_view.RunFolderReader``, within its
byte bounds and again only when a file changed, so asking for them as often as one likes costs the node
little more than a scrape.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from swarmnode import __version__, status_page
from swarmnode.common import atomic_write
from swarmnode.errors import ConfigError, StatusError
from swarmnode.run_view import RunFolderReader
from swarmnode.swarm.exchange.records import ARRIVAL_BUCKETS_S

if TYPE_CHECKING:
    from swarmnode.round_record import RoundRecord
    from swarmnode.swarm.exchange.status import SwarmStatus

TARGET_FILE = "prometheus_target.json"
REQUEST_DEADLINE_S = 5.0  # a connection's request and answer, all reads and writes together
MAX_CONNECTIONS = 16  # connections served at once (a new one closes the oldest still sending its request)
HEALTH_ROUND_STALL_FACTOR = 5.0  # degraded when no round for this many times the last round's duration
HEALTH_MIN_ROUND_AGE_S = 300.0  # ... but never sooner than this after the last round
HEALTH_DHT_STALE_S = 300.0  # degraded when the last successful DHT read (or write) is older than this

# ``RoundRecord`` attribute (dotted into ``train``) -> (metric name, help); all gauges of the last round
ROUND_GAUGES = {
    "policy_version": ("swarmnode_policy_version", "Policy version (optimizer steps so far)."),
    "format_rate": ("swarmnode_answer_format_ratio", "Share of local completions using the answer tags."),
    "sample_tokens_per_s": ("swarmnode_sampling_tokens_per_second", "Sampling throughput, last round."),
    "train.loss": ("swarmnode_loss", "Policy loss of the last update."),
    "train.kl": ("swarmnode_kl", "KL to the reference policy per token (0 when off)."),
    "train.grad_norm": ("swarmnode_grad_norm", "Gradient norm before clipping."),
    "train.ess": (
        "swarmnode_importance_ess_ratio",
        "Effective sample size of the importance weights (0..1).",
    ),
    "train.is_weight_mean": ("swarmnode_importance_weight_mean", "Mean importance weight."),
    "train.is_weight_max": ("swarmnode_importance_weight_max", "Largest importance weight."),
    "train.masked_frac": ("swarmnode_masked_token_ratio", "Share of tokens masked out of the loss."),
    "train.peer_gated_frac": (
        "swarmnode_peer_gated_token_ratio",
        "Share of peer completion tokens the span defence kept out of the loss (offpolicy.peer_defence).",
    ),
    "train.behaviour_kl": ("swarmnode_behaviour_kl", "KL(behaviour || learner), k1 estimate."),
    "groups_kept": ("swarmnode_groups_trained", "Question groups in the last update (nonzero advantage)."),
}
PHASES = ("sample", "score", "share", "train", "sync", "total")


class NodeCollector:
    """Turns the node's latest state into metric families at scrape time, and into the status page's data
    (``page``: its run folder ``run_dir``, read by ``run_view.RunFolderReader``, with its health)."""

    def __init__(self, info: dict[str, str], run_dir: Path | None = None):
        self.info = info
        self.reader = RunFolderReader(run_dir) if run_dir is not None else None
        self.rounds = 0
        self._record: RoundRecord | None = None
        self.swarm: SwarmStatus | None = None
        self.checkpoint_time: float | None = None
        self.started = time.time()
        self.round_time: float | None = None  # time.time() when ``record`` was last set
        self.write_failures = None  # the run log's common.WriteFailures, set by the node

    @property
    def record(self) -> RoundRecord | None:
        return self._record

    @record.setter
    def record(self, record: RoundRecord | None) -> None:
        self._record = record
        if record is not None:
            self.round_time = time.time()

    def problems(self, now: float) -> list[str]:
        """Why the node is degraded (empty: healthy). The swarm checks read the status the swarm hands
        over each round (a ``SwarmStatus``: its ``dht`` and the roster)."""
        reasons = []
        if self.record is not None and self.round_time is not None:
            age = now - self.round_time
            expected = self.record.seconds_total * HEALTH_ROUND_STALL_FACTOR
            if age > max(expected, HEALTH_MIN_ROUND_AGE_S):
                reasons.append(
                    f"no round for {age:.0f} s (the last took {expected / HEALTH_ROUND_STALL_FACTOR:.0f} s)"
                )
        s = self.swarm
        if s is not None:
            if not s.dht.alive:
                reasons.append("the DHT process is not running")
            for what, last in (("read", s.dht.last_read_ok), ("write", s.dht.last_write_ok)):
                if now - (last or self.started) > HEALTH_DHT_STALE_S:
                    reasons.append(f"no successful DHT {what} for {now - (last or self.started):.0f} s")
            if not s.peers:
                reasons.append(f"no peer in the roster ({s.connected} connected)")
        return reasons

    def health(self) -> dict:
        """The ``/health`` answer."""
        round_ = self.record.round if self.record is not None else None
        uptime = round(time.time() - self.started, 1)
        reasons = self.problems(time.time())
        status = "degraded" if reasons else "ok"
        return {
            "status": status,
            "reasons": reasons,
            "rounds": self.rounds,
            "uptime_s": uptime,
            "round": round_,
        }

    def page(self) -> dict:
        """The status page's data: the run folder's view (None before the node wrote any) and health."""
        view = None
        if self.reader is not None:
            with contextlib.suppress(StatusError):  # no round and no status written yet
                view = self.reader.read()
        return status_page.node_page(view, live=True, info=self.info, health=self.health())

    def collect(self) -> Iterator:
        yield _info("swarmnode_node", "The node: model, sampler backend, version, peer id.", self.info)
        rounds = CounterMetricFamily("swarmnode_rounds", "Rounds completed by this process.")
        rounds.add_metric([], self.rounds)
        yield rounds
        yield _gauge(
            "swarmnode_health_ok", "1 when /health says ok, 0 when degraded.", not self.problems(time.time())
        )
        swarm_failures = self.swarm.disk_write_failures if self.swarm else 0
        own_failures = self.write_failures.count if self.write_failures is not None else 0
        disk = CounterMetricFamily(
            "swarmnode_disk_write_failures", "Writes outside checkpoints that failed (a full disk): skipped."
        )
        disk.add_metric([], own_failures + swarm_failures)
        yield disk
        if self.checkpoint_time is not None:
            yield _gauge("swarmnode_checkpoint_timestamp_seconds", "When the last checkpoint was written.",
                         self.checkpoint_time)  # fmt: skip
        torch = sys.modules.get("torch")  # the node has it loaded; never import it just for a scrape
        if torch is not None and torch.cuda.is_available():
            yield _gauge("swarmnode_gpu_memory_allocated_bytes", "GPU memory held by tensors (device 0).",
                         torch.cuda.memory_allocated())  # fmt: skip
        if self.record is not None:
            yield from self._round()
        if self.swarm is not None:
            yield from self._swarm()

    def _round(self) -> Iterator:
        r = self.record
        yield _gauge("swarmnode_round", "Number of the last completed round.", r.round)
        for attribute, (name, doc) in ROUND_GAUGES.items():
            yield _gauge(name, doc, attrgetter(attribute)(r))
        reward = GaugeMetricFamily("swarmnode_reward", "Mean reward of the last round.", labels=["source"])
        reward.add_metric(["local"], r.reward_mean)
        reward.add_metric(["peer"], r.reward_peer_mean)
        yield reward
        by_task = GaugeMetricFamily("swarmnode_task_reward", "Mean local reward per task.", labels=["task"])
        for task, value in r.reward_by_task.items():
            by_task.add_metric([task], value)
        yield by_task
        groups = GaugeMetricFamily("swarmnode_round_groups", "Groups in the last round.", labels=["source"])
        for source in ("local", "peer", "replayed"):
            groups.add_metric([source], getattr(r, f"groups_{source}"))
        yield groups
        phase = GaugeMetricFamily(
            "swarmnode_round_phase_seconds", "Last round's time by phase.", labels=["phase"]
        )
        for name in PHASES:
            phase.add_metric([name], getattr(r, f"seconds_{name}"))
        yield phase
        clip = GaugeMetricFamily("swarmnode_clip_ratio", "Share of tokens clipped.", labels=["side"])
        clip.add_metric(["low"], r.train.clip_low_frac)
        clip.add_metric(["high"], r.train.clip_high_frac)
        yield clip

    def _swarm(self) -> Iterator:
        s = self.swarm
        arrival = HistogramMetricFamily(
            "swarmnode_publish_to_arrival_seconds",
            "From a peer's signed announcement to its batch verified here.",
        )
        a = s.arrival
        buckets = [(str(bound), count) for bound, count in zip(ARRIVAL_BUCKETS_S, a.counts, strict=True)]
        arrival.add_metric([], [*buckets, ("+Inf", a.n)], a.total)
        yield arrival
        yield _gauge("swarmnode_peers_known", "Peers in the swarm roster.", len(s.peers))
        yield from dht_families(asdict(s.dht))
        yield _gauge("swarmnode_peers_connected", "Peers with a libp2p connection.", s.connected)
        yield _gauge(
            "swarmnode_peers_banned", "Peers banned right now.", sum(p.banned for p in s.peers.values())
        )
        rollouts = CounterMetricFamily(
            "swarmnode_rollout_groups", "Question groups by what happened to them.", labels=["event"]
        )
        for event in ("published", "accepted", "trained"):
            rollouts.add_metric([event], getattr(s.rollouts, f"groups_{event}"))
        yield rollouts
        batches = CounterMetricFamily("swarmnode_rollout_batches", "Rollout batches.", labels=["event"])
        batches.add_metric(["published"], s.rollouts.batches_published)
        batches.add_metric(["received"], s.rollouts.batches_received)
        yield batches
        rejected = CounterMetricFamily(
            "swarmnode_rejected", "Peer messages rejected, by reason.", labels=["reason"]
        )
        # Every known reason is exported from 0 (not only those seen so far), so that rate() and the
        # reject-rate alert have a series on a healthy node and the first rejection counts as an increase.
        from swarmnode.swarm.exchange.verify import ALL_REASONS
        from swarmnode.swarm.net.transport import (
            FETCH_FAILURE_REASONS,  # swarm nodes have these loaded already
        )

        for reason, count in {**dict.fromkeys(ALL_REASONS, 0), **s.rejected}.items():
            rejected.add_metric([reason], count)
        yield rejected
        failed = CounterMetricFamily(
            "swarmnode_fetch_failures", "Payload pulls that failed.", labels=["reason"]
        )
        for reason, count in {**dict.fromkeys(FETCH_FAILURE_REASONS, 0), **s.fetch_failures}.items():
            failed.add_metric([reason], count)
        yield failed
        from swarmnode.swarm.net.notices import NOTICE_OUTCOMES

        notices = CounterMetricFamily(
            "swarmnode_notices",
            "Batch notices from peers, by outcome (received or why refused).",
            labels=["outcome"],
        )
        for outcome, count in {**dict.fromkeys(NOTICE_OUTCOMES, 0), **s.notices}.items():
            notices.add_metric([outcome], count)
        yield notices
        refused = CounterMetricFamily(
            "swarmnode_roster_refused",
            "Roster cards not admitted (from the DHT or a notice), by reason.",
            labels=["reason"],
        )
        # roster_full from 0 (a full roster is what an operator watches for); other reasons once seen
        for reason, count in {"roster_full": 0, **s.roster_refused}.items():
            refused.add_metric([reason], count)
        yield refused


def dht_families(dht: dict) -> Iterator:
    """The DHT liveness metrics of a node or a bootstrap (``Transport.dht_health``)."""
    if "alive" in dht:
        yield _gauge("swarmnode_dht_alive", "1 while the DHT process runs.", dht["alive"])
    for what in ("read", "write"):
        if dht.get(f"last_{what}_ok"):
            yield _gauge(f"swarmnode_dht_last_{what}_timestamp_seconds", f"Last successful DHT {what}.",
                         dht[f"last_{what}_ok"])  # fmt: skip
    failures = CounterMetricFamily("swarmnode_dht_failures", "DHT calls that failed.", labels=["op"])
    for op in ("read", "store"):
        failures.add_metric([op], dht.get(f"{op}_failed", 0))
    yield failures


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], float(value))
    return family


def _info(name: str, doc: str, labels: dict[str, str]) -> InfoMetricFamily:
    family = InfoMetricFamily(name, doc)
    family.add_metric([], labels)
    return family


class _DeadlineSocket(io.RawIOBase):
    """A connection's socket, read and written with one deadline for all of it: each call may wait only
    for what is left (a socket timeout is per call, so a client sending a byte at a time resets it)."""

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def _wait_at_most_what_is_left(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the connection outlived its {REQUEST_DEADLINE_S:.0f} s")
        self._sock.settimeout(left)

    def readinto(self, buffer) -> int:
        self._wait_at_most_what_is_left()
        return self._sock.recv_into(buffer)

    def write(self, data) -> int:
        self._wait_at_most_what_is_left()
        self._sock.sendall(data)
        return len(data)


class _QuietHandler(WSGIRequestHandler):
    """Reads and writes under the connection's REQUEST_DEADLINE_S; tells the server when the request is
    in (the connection is then no longer evictable)."""

    def setup(self) -> None:
        self.connection = self.request
        deadline = time.monotonic() + REQUEST_DEADLINE_S
        self.rfile = io.BufferedReader(_DeadlineSocket(self.connection, deadline))
        self.wfile = _DeadlineSocket(self.connection, deadline)

    def parse_request(self) -> bool:  # called once the request line is in; it reads the headers
        ok = super().parse_request()
        self.server.request_read(self.request)
        return ok

    def log_message(self, *args) -> None:  # scrapes every few seconds would flood the node's log
        pass


class _ThreadedServer(socketserver.ThreadingMixIn, WSGIServer):
    """One thread per connection, at most MAX_CONNECTIONS at once: a new one closes the oldest connection
    still sending its request, or is closed unanswered if every connection is past its request."""

    daemon_threads = True

    def __init__(self, *args, **kwargs) -> None:
        self._lock = threading.Lock()
        self._open: dict[socket.socket, bool] = {}  # connection -> its request read; oldest first
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        if not self._admit(request):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _admit(self, request: socket.socket) -> bool:
        with self._lock:
            if len(self._open) >= MAX_CONNECTIONS:
                victim = next((s for s, read in self._open.items() if not read), None)
                if victim is None:
                    return False
                del self._open[victim]
                with contextlib.suppress(OSError):
                    victim.shutdown(socket.SHUT_RDWR)  # its thread's read returns at once
            self._open[request] = False
            return True

    def request_read(self, request: socket.socket) -> None:
        with self._lock:
            if request in self._open:
                self._open[request] = True

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._open.pop(request, None)

    def handle_error(self, request, client_address) -> None:
        """A client that ran out of time, hung up or was evicted is its own problem: nothing printed."""
        if not isinstance(sys.exc_info()[1], OSError):  # TimeoutError and ConnectionError included
            super().handle_error(request, client_address)


class MetricsServer:
    """``/metrics`` (Prometheus text format), ``/health`` (JSON) and the status page (``/``, and the
    ``/page.json`` it refreshes from: ``status_page``) in a daemon thread.

    ``collector`` is a NodeCollector or anything else with ``collect()``, ``health()`` and ``page()`` (the
    bootstrap's).
    """

    def __init__(self, collector: Any, host: str, port: int):
        self.collector = collector
        self.registry = CollectorRegistry()
        self.registry.register(collector)
        ProcessCollector(registry=self.registry, namespace="swarmnode")  # RSS, CPU, open fds
        try:
            self._server: WSGIServer = make_server(
                host, port, self._app, server_class=_ThreadedServer, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise _port_error(exc, host, port) from None
        self.host, self.port = host, self._server.server_port
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _app(self, environ, start_response):
        path = environ.get("PATH_INFO", "/")
        code = "200 OK"
        if path == "/metrics":
            body, ctype = generate_latest(self.registry), CONTENT_TYPE_LATEST
        elif path == "/health":
            health = self.collector.health()
            body, ctype = json.dumps(health).encode(), "application/json"
            if health["status"] != "ok":
                code = "503 Service Unavailable"
        elif path == "/":
            body, ctype = status_page.render(self.collector.page()).encode(), "text/html; charset=utf-8"
        elif path == "/page.json":
            body, ctype = status_page.page_json(self.collector.page()), "application/json"
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"see / (the status page), /metrics and /health\n"]
        start_response(code, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        return [body]

    def write_target(self, run_dir: Path, labels: dict[str, str]) -> Path:
        """A Prometheus ``file_sd_configs`` entry for this node, replaced atomically."""
        path = run_dir / TARGET_FILE
        atomic_write(path, json.dumps([{"targets": [f"{self.host}:{self.port}"], "labels": labels}]))
        return path

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _port_error(exc: OSError, host: str, port: int) -> ConfigError:
    what = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be opened ({exc.strerror})"
    return ConfigError(
        f"metrics port {port} on {host} {what}: set run.metrics_port (bootstrap.metrics_port for a "
        "bootstrap) to a free port, 0 for any free port, or null to turn metrics off"
    )


def check_metrics_port(host: str, port: int) -> None:
    """Bind the metrics port briefly, as the server will (SO_REUSEADDR), so that a taken port is named
    before anything slow starts (preflight.py); the ConfigError the server would raise."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise _port_error(exc, host, port) from None


def retire_target(run_dir: Path) -> None:
    """Empty the node's target file (``[]``) after a clean stop, so that Prometheus drops the target and
    ``SwarmnodeDown`` does not fire for a node stopped on purpose; a crash leaves the file, and the alert.

    Emptied rather than removed: the file is usually linked into Prometheus's targets folder, and file_sd
    keeps the last targets it read from a file it cannot read (a dangling link), so removing it would
    alert forever. A restart writes the target again."""
    atomic_write(Path(run_dir) / TARGET_FILE, "[]\n")


def node_info(peer_id: str, model: str, backend: str) -> dict[str, str]:
    return {"peer_id": peer_id, "model": model, "backend": backend, "version": __version__}
