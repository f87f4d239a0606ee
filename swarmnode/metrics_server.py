"""The metrics HTTP server: ``/metrics``, ``/health`` and the status page (``/``, ``/page.json``), hardened.

A server is handed what it serves: a collector with ``collect()`` (Prometheus families), ``health()`` (the
``/health`` answer) and ``page()`` (the status page's data), a node's (``metrics.NodeCollector``) or a
bootstrap's, and knows nothing else of either. It has its own registry (several nodes share a test
process) with the process collector (RSS, CPU, open fds).

Idle or trickling clients, even ones that reconnect at once, cannot block a scrape: each connection is
answered on its own thread (at most ``MAX_CONNECTIONS`` at once), one request each, and has
``REQUEST_DEADLINE_S`` in all to send its request and take the answer, however it trickles its bytes; when
every slot is taken, a new connection closes the oldest one still sending its request, or else the oldest
one whose answer has been going out for ``SLOW_ANSWER_S`` (a scraper sends its request at once and reads
the answer as it comes, in milliseconds on any network a scrape crosses, so only a connection that trickles
or does not read is ever closed for another). A client's failures (time out, hang up, closed for another)
are its own: nothing is printed for them; an error of the server's own is logged once per request.

Pages are answered only under a Host name that cannot be a stranger's DNS name for this machine (DNS
rebinding: a web page whose name an attacker points at 127.0.0.1 would read the status page from the
browser of anyone running a node): an IP literal, ``localhost`` or a ``.localhost`` name, a name without
a dot (a compose service, a LAN host), or this machine's own host name; anything else gets
``421 Misdirected Request``. A request without a Host header (HTTP/1.0) is answered.

Prometheus finds a node through a file-discovery target (``<run_dir>/prometheus_target.json``,
``MetricsServer.write_target``) with its address, emptied when the node stops cleanly (``retire_target``).
A taken port is a user's error with what to do (``check_metrics_port``, before anything slow starts).
"""

from __future__ import annotations

import contextlib
import errno
import io
import ipaddress
import json
import logging
import socket
import socketserver
import sys
import threading
import time
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from swarmnode import status_page
from swarmnode.common import atomic_write
from swarmnode.errors import ConfigError

TARGET_FILE = "prometheus_target.json"
REQUEST_DEADLINE_S = 5.0  # a connection's request and answer, all reads and writes together
MAX_CONNECTIONS = 16  # connections served at once (a new one closes the oldest still sending its request)
SLOW_ANSWER_S = 0.5  # ... or the oldest whose answer has been going out this long, when none is

log = logging.getLogger(__name__)


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

    def get_stderr(self):
        """Where wsgiref writes the traceback of an error while answering: the client's own (it timed out,
        hung up or was closed for another) is dropped, the server's own is logged."""
        return _ErrorLog()


class _ErrorLog(io.TextIOBase):
    """wsgiref's error stream. It writes while handling the exception, so the exception says whose it is."""

    def write(self, text: str) -> int:
        if text.strip() and not isinstance(sys.exc_info()[1], OSError):  # TimeoutError, ConnectionError...
            log.warning("metrics server: %s", text.rstrip())
        return len(text)


class _ThreadedServer(socketserver.ThreadingMixIn, WSGIServer):
    """One thread per connection, at most MAX_CONNECTIONS at once: a new one closes the oldest connection
    still sending its request, else the oldest answered for SLOW_ANSWER_S, else it is closed unanswered."""

    daemon_threads = True

    def __init__(self, *args, **kwargs) -> None:
        self._lock = threading.Lock()
        # connection -> when its request was read (None: still sending it); oldest connection first
        self._open: dict[socket.socket, float | None] = {}
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        if not self._admit(request):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _admit(self, request: socket.socket) -> bool:
        with self._lock:
            if len(self._open) >= MAX_CONNECTIONS:
                victim = next((s for s, read in self._open.items() if read is None), None)
                if victim is None:
                    slow = time.monotonic() - SLOW_ANSWER_S
                    victim = next((s for s, read in self._open.items() if read <= slow), None)
                if victim is None:
                    return False
                del self._open[victim]
                with contextlib.suppress(OSError):
                    victim.shutdown(socket.SHUT_RDWR)  # its thread's read returns at once
            self._open[request] = None
            return True

    def request_read(self, request: socket.socket) -> None:
        with self._lock:
            if request in self._open:
                self._open[request] = time.monotonic()

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
        if not _own_host_name(environ.get("HTTP_HOST")):
            start_response("421 Misdirected Request", [("Content-Type", "text/plain")])
            return [b"ask for this node by its IP address, localhost or a name without a dot\n"]
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


def _own_host_name(host: str | None) -> bool:
    """Whether a Host header names this machine in a way no stranger's DNS name can (module docstring)."""
    if host is None:
        return True
    name = host.strip().lower()
    if name.startswith("["):  # [IPv6]:port
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(name)
        return True
    own = {socket.gethostname().lower(), socket.getfqdn().lower()}
    return "." not in name or name == "localhost" or name.endswith(".localhost") or name in own


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
