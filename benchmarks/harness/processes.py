"""Real ``swarmnode`` processes (join, solo, bootstrap) on 127.0.0.1, and reading what they write.

Each node is a subprocess (its own hivemind DHT and p2pd) started from the repository root; the
helpers end only the processes they started, by PID, and every wait is bounded. The integration tests
and the benchmarks both drive nodes through this module. A wait that misses raises ``AssertionError`` with
the node's last output (a test failure; a driver catches it and reports), also under ``python -O``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout: nodes start here, node_configs/ is here
JOIN_HINT = "swarmnode join --peers "
CLOCK_JUMP = Path(__file__).resolve().with_name("_clock_jump.py")  # a prefix: a node with a skewed clock


class LineReader:
    """Collects a child's output lines in a thread; ``wait_for_line`` waits (bounded) for one."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line)

    def wait_for_line(
        self, match: Callable[[str], bool], timeout_s: float, describe: Callable[[], str]
    ) -> str:
        deadline = time.monotonic() + timeout_s
        for line in list(self.lines):
            if match(line):
                return line
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if match(line):
                return line
        raise AssertionError(f"no matching line within {timeout_s}s: {describe()}")


@dataclass
class NodeProc:
    run_dir: Path
    proc: subprocess.Popen
    reader: LineReader

    @property
    def lines(self) -> list[str]:
        return self.reader.lines

    def wait_for_line(self, needle: str, timeout_s: float) -> str:
        return self.reader.wait_for_line(
            lambda line: needle in line,
            timeout_s,
            lambda: f"node {self.run_dir}, {needle!r}:\n{self.output()}",
        )

    def address(self, starting: str = "", timeout_s: float = 90.0) -> str:
        """The address of the first join hint whose address starts with ``starting`` (e.g. a host's
        "/ip4/10.0.0.2/tcp/31337/p2p/"); the hint goes on with --config / --set after it."""
        return self.wait_for_line(JOIN_HINT + starting, timeout_s).split(JOIN_HINT, 1)[1].split()[0]

    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def metrics(self) -> list[dict]:
        return read_jsonl(self.run_dir / "metrics.jsonl")

    def status(self) -> dict:
        return json.loads((self.run_dir / "status.json").read_text())

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"node {self.run_dir} still running after {timeout_s}s:\n{self.output()}"
            ) from None

    def wait_for_round(self, round_: int, timeout_s: float = 240.0) -> None:
        """Until metrics.jsonl has round ``round_`` (the node must stay up meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while not any(r["round"] >= round_ for r in self.metrics()):
            if self.proc.poll() is not None:
                raise AssertionError(f"node {self.run_dir} exited before round {round_}:\n{self.output()}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"no round {round_} in {timeout_s}s:\n{self.output()}")
            time.sleep(1.0)

    def interrupt(self, timeout_s: float = 90.0) -> int:
        """SIGINT, then wait for the exit code (130 for a clean stop: the node finished or abandoned its
        round, checkpointed and put its offline card)."""
        os.kill(self.proc.pid, signal.SIGINT)
        return self.wait(timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """End this node (SIGINT first, so it shuts its DHT and daemon down cleanly)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def start_node(
    run_dir: Path, *args: str, peers: list[str] = (), command: str = "join", prefix: Sequence[str] = ()
) -> NodeProc:
    """``swarmnode <command> --run-dir run_dir *args`` (``join`` or ``solo``), stderr collected.

    ``prefix`` wraps the command, e.g. ``netns.Host.exec_args()`` to run the node in a network namespace.
    """
    cmd = [*prefix, sys.executable, "-m", "swarmnode.cli", command, "--run-dir", str(run_dir), *args]
    for peer in peers:
        cmd += ["--peers", peer]
    return _spawn(cmd, run_dir)


def start_bootstrap(work_dir: Path, *args: str, prefix: Sequence[str] = ()) -> NodeProc:
    """``swarmnode bootstrap *args`` with its key in ``work_dir`` and metrics on a free port."""
    work_dir.mkdir(parents=True, exist_ok=True)
    cmd = [*prefix, sys.executable, "-m", "swarmnode.cli", "bootstrap", "--identity",
           str(work_dir / "bootstrap.key"), "--set", "bootstrap.metrics_port=0", *args]  # fmt: skip
    return _spawn(cmd, work_dir)


def node_env() -> dict[str, str]:
    """This process's environment for a node process: unbuffered output (lines arrive as they are said)
    and one compute thread, since several nodes share a few cores and oversubscribed OpenMP threads spin
    and starve each other (results are the same: the tiny model's digests match across thread counts)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def _spawn(cmd: list[str], run_dir: Path) -> NodeProc:
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=node_env(),
    )
    return NodeProc(run_dir, proc, LineReader(proc.stderr))


def stop_all(nodes: list[NodeProc], timeout_s: float = 30.0) -> None:
    """SIGINT every node still running (they shut down in parallel), then SIGKILL the stragglers."""
    for node in nodes:
        if node.proc.poll() is None:
            try:
                os.kill(node.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout_s
    for node in nodes:
        try:
            node.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except Exception:
            node.kill()  # SIGKILL by PID; its DHT process and p2pd exit when they see it gone


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file up to the first torn line (a killed writer); [] if missing."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out
