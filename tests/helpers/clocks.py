"""A clock a test sets by hand, for code that takes its clock as an argument (``clock=time.monotonic``)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
