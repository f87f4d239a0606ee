"""How the parts of a learning experiment share one machine (benchmarks.common): parts started side by
side evaluate in turn (one_at_a_time), behind any part that trains (behind_other_sessions), and a training
part's nodes are awaited with a bound and progress lines (wait_all)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.common import one_at_a_time, wait_all
from benchmarks.harness.processes import NodeProc


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


def sleeper(tmp_path, seconds: float) -> NodeProc:
    """A process that lives ``seconds``; wait_all only watches ``proc`` (no log reader needed)."""
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    return NodeProc(run_dir=tmp_path, proc=proc, reader=None)


def test_progress_is_printed_while_nodes_run_and_the_wait_ends_when_all_exit(tmp_path, capsys):
    nodes = [sleeper(tmp_path, 0.6), sleeper(tmp_path, 1.2)]
    calls = []

    def progress() -> str:
        calls.append(sum(node.proc.poll() is None for node in nodes))
        return f"running {calls[-1]}"

    t0 = time.monotonic()
    assert wait_all(nodes, time.monotonic() + 30, progress, every_s=0.25) is False
    assert time.monotonic() - t0 < 10
    assert all(node.proc.returncode == 0 for node in nodes)
    assert len(calls) >= 3 and calls[0] == 2 and calls[-1] == 1
    assert "running 2" in capsys.readouterr().err


def test_the_wait_ends_at_the_limit_with_a_node_still_running(tmp_path):
    node = sleeper(tmp_path, 60)
    try:
        t0 = time.monotonic()
        assert wait_all([node], time.monotonic() + 0.5, every_s=0.1) is True
        assert 0.5 <= time.monotonic() - t0 < 5
        assert node.proc.poll() is None
    finally:
        node.proc.kill()
        node.proc.wait()


AUTOGROUP_PROBE = """
import sys
from pathlib import Path
from benchmarks.common import behind_other_sessions
group = Path(sys.argv[1])
with behind_other_sessions(group):
    print(group.read_text().split()[-1])
print(group.read_text().split()[-1])
"""


def nice_inside_and_after(group: Path, new_session: bool) -> list[str]:
    """The autogroup's nice value inside behind_other_sessions and after it, in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", AUTOGROUP_PROBE, str(group)], capture_output=True, text=True, timeout=60,
        start_new_session=new_session, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="this kernel has no autogroups")
def test_an_evaluating_session_leader_lowers_its_autogroup_and_restores_it():
    assert nice_inside_and_after(Path("/proc/self/autogroup"), new_session=True) == ["19", "0"]


def test_a_process_that_does_not_lead_its_session_leaves_the_group_alone(tmp_path):
    group = tmp_path / "autogroup"  # a stand-in file: the real one would be the test runner's session
    group.write_text("/autogroup-7 nice 0\n")
    assert nice_inside_and_after(group, new_session=False) == ["0", "0"]
