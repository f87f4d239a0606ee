"""The metrics server against clients that trickle their request (issue #26): 20 clients sending one byte
a second (under any per-read timeout) and reconnecting at once when closed took all 16 slots for as long
as they liked; a real scrape must still be answered, and no trickling connection outlive its deadline."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
import urllib.request

from swarmnode.metrics import NodeCollector
from swarmnode.metrics_server import MAX_CONNECTIONS, REQUEST_DEADLINE_S, MetricsServer
from tests.helpers.http_clients import ReconnectingClient

TRICKLERS = MAX_CONNECTIONS + 4
TRICKLE_S = 1.0  # one byte this often: far under the 5 s a per-read timeout allowed
SCRAPES = 5
SCRAPE_ANSWER_S = 2.0  # each scrape answered within this


class Trickler(ReconnectingClient):
    """Sends a request one byte every TRICKLE_S that never ends."""

    def hold(self, sock: socket.socket, end: float) -> None:
        self.connected.set()
        sock.sendall(b"GET /metrics HTTP/1.0\r\nX-Slow: ")
        while not self.stop.is_set() and time.monotonic() < end and not _closed(sock, TRICKLE_S):
            try:
                sock.sendall(b"a")
            except OSError:
                break


def _closed(sock: socket.socket, wait_s: float) -> bool:
    """Whether the server closed ``sock`` (waits up to ``wait_s`` to find out)."""
    readable, _, _ = select.select([sock], [], [], wait_s)
    if not readable:
        return False
    try:
        return sock.recv(1024) == b""
    except OSError:
        return True


def _scrape(url: str) -> float:
    """Seconds until /metrics answered; raises if it did not."""
    t = time.monotonic()
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        assert b"swarmnode_rounds_total" in reply.read()
    return time.monotonic() - t


def test_trickling_clients_that_reconnect_cannot_hold_the_metrics_server():
    server = MetricsServer(NodeCollector({}), "127.0.0.1", 0)
    stop = threading.Event()
    tricklers = [Trickler(server.port, stop, max_s=60.0) for _ in range(TRICKLERS)]
    try:
        started = time.monotonic()
        for t in tricklers:
            t.start()
        for t in tricklers:
            assert t.connected.wait(10)
        time.sleep(REQUEST_DEADLINE_S / 2)  # every slot held by a trickler, each past its first bytes
        answers, failures = [], []
        for _ in range(SCRAPES):
            try:
                answers.append(_scrape(server.url))
            except OSError as exc:  # refused: closed unanswered
                failures.append(repr(exc))
            time.sleep(0.5)
        # until a connection opened at the start and never cut would have lived past the bound asserted below
        time.sleep(max(started + REQUEST_DEADLINE_S + 2 * TRICKLE_S + 0.5 - time.monotonic(), 0))
        stop.set()
        for t in tricklers:
            t.join(5)
        lived = [s for t in tricklers for s in t.lived]
        print(f"scrapes {answers} failed {failures}; {len(lived)} trickling connections, longest "
              f"{max(lived):.1f} s")  # fmt: skip
        assert not failures and max(answers) < SCRAPE_ANSWER_S, (answers, failures)
        assert max(lived) < REQUEST_DEADLINE_S + 2 * TRICKLE_S, max(lived)
    finally:
        stop.set()
        for t in tricklers:
            t.join(5)
        with contextlib.suppress(Exception):
            server.close()


def test_a_trickling_request_is_cut_at_its_deadline_however_often_bytes_arrive():
    server = MetricsServer(NodeCollector({}), "127.0.0.1", 0)
    stop = threading.Event()
    tricklers = [Trickler(server.port, stop, max_s=REQUEST_DEADLINE_S + 4 * TRICKLE_S) for _ in range(4)]
    try:
        for t in tricklers:
            t.start()
        deadline = time.monotonic() + REQUEST_DEADLINE_S + 10 * TRICKLE_S
        while not all(t.lived for t in tricklers) and time.monotonic() < deadline:
            time.sleep(0.1)  # until each first connection has ended (one never cut ends at max_s, too long)
        stop.set()
        for t in tricklers:
            t.join(5)
        first = [t.lived[0] for t in tricklers if t.lived]
        print(f"first connections lived {first}")
        assert len(first) == len(tricklers) and max(first) < REQUEST_DEADLINE_S + 2 * TRICKLE_S, first
    finally:
        stop.set()
        for t in tricklers:
            t.join(5)
        server.close()
