"""Stopping on Ctrl-C or SIGTERM without losing a completed round.

The first SIGINT/SIGTERM stops the node at the next safe point: at once while the round has not yet
started to change the weights (the round is abandoned; the state is still the last completed round's),
or, once the update has begun, when the round is complete (an optimizer step cut halfway would leave
weights that belong to no round). The node then checkpoints the last completed round and exits with
128 + the signal number (130 for Ctrl-C, 143 for SIGTERM). A second signal exits at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from swarmnode.common import log

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """Raised in the main thread at a safe point after a stop signal; ``exit_code`` = 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


class StopSignals:
    """Turns the first stop signal into ``Stopped`` at a safe point; see the module docstring."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._held = False

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """Handle SIGINT/SIGTERM while the block runs (only the main thread can; elsewhere: no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def hold(self) -> None:
        """The weights start to change: a signal from now on waits for ``release``."""
        self._held = True

    def release(self) -> None:
        """The round is complete: raise ``Stopped`` if a signal came while held."""
        self._held = False
        if self.received is not None:
            raise Stopped(self.received)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:
            log("second stop signal: exiting now, without a checkpoint of the last round")
            raise SystemExit(128 + signum)
        self.received = signum
        if not self._held:
            raise Stopped(signum)
        log("stopping once this round's update is done (press Ctrl-C again to quit at once)")
