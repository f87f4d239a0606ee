"""A background loop for the benchmarks' watchers of running nodes: ``tick`` every ``period_s`` in a
daemon thread, from ``start`` until ``stop``."""

from __future__ import annotations

import threading
from typing import Self


class Periodic:
    """Subclasses define ``tick``. ``at_once``: the first tick at start rather than one period later;
    ``join_s``: how long ``stop`` waits for a tick in progress."""

    def __init__(self, period_s: float, *, at_once: bool = False, join_s: float = 10.0):
        self.period_s, self._at_once, self._join_s = period_s, at_once, join_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._join_s)

    def _run(self) -> None:
        if self._at_once:
            self.tick()
        while not self._stop.wait(self.period_s):
            self.tick()
