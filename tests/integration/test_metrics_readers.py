"""The metrics server against clients that send a whole request and never read the answer, and against
pages asked for under a foreign Host name (DNS rebinding: a web page whose name resolves to 127.0.0.1).

A client that never reads holds its connection for the server's whole write of a large answer; 16 such
clients reconnecting at once held every slot (0 of 10 ``/health`` scrapes answered) and printed a
traceback each. The server is handed a collector whose status page is 4 MiB (a real server, a real
collector interface; the page's size is what a node with a long history and many peers could serve).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
import urllib.request

from swarmnode.metrics import NodeCollector
from swarmnode.metrics_server import MAX_CONNECTIONS, REQUEST_DEADLINE_S, MetricsServer
from tests.helpers.http_clients import ReconnectingClient

PAGE_BYTES = 4 * 1024 * 1024
SCRAPES = 10
SCRAPE_ANSWER_S = 2.0


class BigPageCollector(NodeCollector):
    """A node's collector whose status page data is ``PAGE_BYTES`` of peer names."""

    def page(self) -> dict:
        page = super().page()
        page["filler"] = "x" * PAGE_BYTES
        return page


class NonReader(ReconnectingClient):
    """Sends ``GET /page.json`` whole, with a small receive buffer, and never reads a byte of the answer."""

    def hold(self, sock: socket.socket, end: float) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        with contextlib.suppress(OSError):
            sock.sendall(b"GET /page.json HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        self.connected.set()
        while not self.stop.is_set() and time.monotonic() < end:  # until the server closes it
            try:
                sock.send(b"\n")  # past the request, never read; raises once the server closed the connection
            except OSError:
                return
            self.stop.wait(0.2)


def test_clients_that_never_read_the_answer_cannot_hold_the_metrics_server(capfd):
    server = MetricsServer(BigPageCollector({}), "127.0.0.1", 0)
    stop = threading.Event()
    readers = [NonReader(server.port, stop, max_s=60.0) for _ in range(MAX_CONNECTIONS)]
    try:
        for r in readers:
            r.start()
        for r in readers:
            assert r.connected.wait(10)
        time.sleep(1.0)  # every slot answering a client that does not read
        answered, failed = [], []
        for _ in range(SCRAPES):
            t = time.monotonic()
            try:
                with urllib.request.urlopen(server.url + "/health", timeout=SCRAPE_ANSWER_S) as reply:
                    reply.read()
                answered.append(time.monotonic() - t)
            except OSError as exc:
                failed.append(repr(exc))
        stop.set()
        for r in readers:
            r.join(5)
        slowest = max(answered, default=0.0)
        print(f"answered {len(answered)} of {SCRAPES} (slowest {slowest:.2f} s); {failed[:2]}")
        assert len(answered) == SCRAPES, failed
    finally:
        stop.set()
        for r in readers:
            r.join(5)
        server.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-2000:]


def test_a_client_that_outlives_its_deadline_prints_nothing(capfd):
    """Not every slot is taken, so the client is cut at its deadline (a TimeoutError mid-answer)."""
    server = MetricsServer(BigPageCollector({}), "127.0.0.1", 0)
    stop = threading.Event()
    reader = NonReader(server.port, stop, max_s=REQUEST_DEADLINE_S + 1.5)
    try:
        reader.start()
        reader.join(REQUEST_DEADLINE_S + 10)
    finally:
        stop.set()
        server.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-2000:]


def _status(port: int, path: str, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_page_asked_for_under_a_foreign_name_is_refused():
    server = MetricsServer(NodeCollector({}), "127.0.0.1", 0)
    try:
        port = server.port
        for host in (f"127.0.0.1:{port}", "localhost", f"[::1]:{port}", "node1:9400", socket.gethostname()):
            assert _status(port, "/health", host) in (200, 503), host  # 503: a node not yet healthy
        for host in ("attacker.example", f"rebind.attacker.example:{port}", "127.0.0.1.nip.io"):
            for path in ("/", "/page.json", "/metrics", "/health"):
                assert _status(port, path, host) == 421, (host, path)
    finally:
        server.close()
