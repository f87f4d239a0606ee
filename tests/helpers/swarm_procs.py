"""Test-only process helpers: the hostile peer's process, process groups, free ports, liveness.

Starting real ``swarmnode`` nodes is ``benchmarks.harness.processes`` (the benchmarks drive nodes with
it too); what is here only tests use. Helpers end only the processes they started, by PID or by the
process group they created, and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.processes import REPO, LineReader, node_env

HELPERS = Path(__file__).resolve().parent  # the scripts tests run as processes (hostile peers, attackers)
HOSTILE_SCRIPT = HELPERS / "hostile_peer.py"


@dataclass
class HostileProc:
    """A ``hostile_peer.py`` process (its own process group: it, its DHT process and p2pd)."""

    attack: str
    proc: subprocess.Popen
    log_path: Path
    reader: LineReader

    @property
    def lines(self) -> list[str]:
        return self.reader.lines

    def wait_for_line(self, prefix: str, timeout_s: float) -> str:
        """The first line starting with ``prefix`` (the script's markers: READY, DONE, ...)."""
        return self.reader.wait_for_line(
            lambda line: line.startswith(prefix),
            timeout_s,
            lambda: f"hostile {self.attack}, {prefix!r}:\n{self.output()}",
        )

    def report(self, timeout_s: float) -> dict:
        """The ``DONE`` summary: peer id and every step (digest, requested, served)."""
        return json.loads(self.wait_for_line("DONE ", timeout_s).split(" ", 1)[1])

    def output(self) -> str:
        err = self.log_path.read_text()[-4000:] if self.log_path.exists() else ""
        return "stdout:\n" + "\n".join(self.lines[-40:]) + "\nstderr (tail):\n" + err

    def kill(self) -> None:
        """SIGKILL the hostile process itself, by its pid (its DHT process and p2pd notice and exit)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Close its stdin (it shuts down cleanly); kill it if it does not. Then make sure nothing of its
        process group (which this helper started) is left."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        deadline = time.monotonic() + 10.0
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # only the group this helper started


def start_hostile(attack: str, work_dir: Path, swarm_id: str, honest_addr: str) -> HostileProc:
    work_dir.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / f"{attack}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(HOSTILE_SCRIPT), attack, str(work_dir), swarm_id, honest_addr],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=node_env(),
            start_new_session=True,  # its own process group, so cleanup can reach its DHT process and p2pd
        )
    return HostileProc(attack, proc, log_path, LineReader(proc.stdout))


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group a test started with ``start_new_session=True``, by its leader's PID (a
    bare hivemind DHT and its p2pd outlive their parent otherwise), and reap the leader."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago (the kernel's pick for port 0).

    Another process may take it before the caller binds it; tests use it for a process they start at
    once, or as an address where nothing answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child not yet reaped still has a pid)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
