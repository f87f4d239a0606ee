"""benchmarks.common.one_at_a_time: parts of an experiment started side by side evaluate in turn."""

from __future__ import annotations

import threading
import time

from benchmarks.common import one_at_a_time


def test_a_second_holder_runs_only_after_the_first_leaves(tmp_path, capsys):
    lock = tmp_path / "runs" / "evaluation.lock"
    events: list[str] = []

    def second() -> None:
        with one_at_a_time(lock, "second", limit_s=10, poll_s=0.02):
            events.append("second in")

    with one_at_a_time(lock, "first", limit_s=10, poll_s=0.02):
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.3)
        events.append("first out")
    waiter.join(timeout=10)
    assert events == ["first out", "second in"]
    assert "second: waiting for the process holding" in capsys.readouterr().err


def test_the_wait_is_bounded_and_the_block_then_runs_anyway(tmp_path, capsys):
    lock = tmp_path / "evaluation.lock"
    with one_at_a_time(lock, "first", limit_s=10):
        t0 = time.monotonic()
        with one_at_a_time(lock, "second", limit_s=0.2, poll_s=0.05):
            waited = time.monotonic() - t0
    assert 0.2 <= waited < 5
    assert "second: waited 0.2 s for" in capsys.readouterr().err
