"""The one bounded poll that the tests and the benchmarks' drivers use: every wait on another thread or
process has a deadline, and the caller says what a miss means (an ``assert`` with a message in a test,
a ``False`` that a driver reports)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout_s: float, period_s: float = 0.02) -> bool:
    """Call ``condition`` every ``period_s`` until it is true or ``timeout_s`` has passed; whether it
    became true. It is called once more at the deadline, so a condition that turned true during the
    last sleep counts. The default period suits cheap in-process checks; one that reads files or logs
    wants a longer one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(period_s)
    return bool(condition())
