"""Starting real `swarmnode join` processes on 127.0.0.1 for integration tests.

Each node is a subprocess of the test (its own hivemind DHT and p2pd); the helpers end only the
processes they started, by PID, and every wait is bounded.
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
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOIN_HINT = "swarmnode join --peers "


@dataclass
class NodeProc:
    run_dir: Path
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    _queue: queue.Queue = field(default_factory=queue.Queue)

    def _pump(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line)

    def wait_for_line(self, needle: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        for line in list(self.lines):
            if needle in line:
                return line
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if needle in line:
                return line
        raise AssertionError(f"no line containing {needle!r} within {timeout_s}s; output:\n" + self.output())

    def address(self, timeout_s: float = 90.0) -> str:
        return self.wait_for_line(JOIN_HINT, timeout_s).split(JOIN_HINT, 1)[1].strip()

    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def metrics(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def status(self) -> dict:
        return json.loads((self.run_dir / "status.json").read_text())

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {self.run_dir} still running after {timeout_s}s:\n{self.output()}") from None

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


def start_node(run_dir: Path, *args: str, peers: list[str] = ()) -> NodeProc:
    cmd = [sys.executable, "-m", "swarmnode.cli", "join", "--run-dir", str(run_dir), *args]
    for peer in peers:
        cmd += ["--peers", peer]
    # One torch thread per node: several nodes share 2 cores, and spinning OpenMP threads starve each other.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    node = NodeProc(run_dir, proc)
    threading.Thread(target=node._pump, daemon=True).start()
    return node
