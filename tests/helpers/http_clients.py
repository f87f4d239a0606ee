"""Hostile HTTP clients of the metrics server, one thread each: they connect, do their one bad thing with
the connection, and reconnect as soon as the server closes it, as an attacker holding slots would."""

from __future__ import annotations

import socket
import threading
import time

RECONNECT_S = 0.05  # a closed client reconnects this soon


class ReconnectingClient(threading.Thread):
    """Connects to 127.0.0.1:``port``, hands the connection to ``hold`` until that returns, reconnects.
    Bounded: stops on ``stop`` or after ``max_s``. ``lived`` has each connection's lifetime."""

    def __init__(self, port: int, stop: threading.Event, max_s: float):
        super().__init__(daemon=True)
        self.port, self.stop, self.max_s = port, stop, max_s
        self.lived: list[float] = []
        self.connected = threading.Event()

    def hold(self, sock: socket.socket, end: float) -> None:
        """Use ``sock`` until the server closes it, ``stop`` is set or ``end`` (monotonic) passes."""
        raise NotImplementedError

    def run(self) -> None:
        end = time.monotonic() + self.max_s
        while not self.stop.is_set() and time.monotonic() < end:
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            except OSError:
                self.stop.wait(RECONNECT_S)
                continue
            opened = time.monotonic()
            with sock:
                self.hold(sock, end)
            self.lived.append(time.monotonic() - opened)
            self.stop.wait(RECONNECT_S)
