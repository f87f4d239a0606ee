"""What the benchmark and experiment scripts share: the machine they ran on, node processes, run logs.

Scripts run from a checkout (``python benchmarks/X.py``); node processes are real ``swarmnode`` CLI
subprocesses started with ``tests/integration/swarm_procs.py``'s helpers, ended only by their PID.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.integration.swarm_procs import NodeProc


def machine_info(script: str) -> dict:
    """CPU, cores, memory and load, plus swarmnode processes not started by ``script`` (CPU rivals)."""
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = avail_gib = float("nan")
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        mem_gib = int(meminfo["MemTotal"].split()[0]) / 2**20
        avail_gib = int(meminfo["MemAvailable"].split()[0]) / 2**20
    except (OSError, KeyError, ValueError):
        pass
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "mem_gib": round(mem_gib, 1),
        "mem_available_gib": round(avail_gib, 1),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "other_swarmnode_processes": other_swarmnode_processes(script),
    }


def describe_machine(machine: dict, now: bool = True) -> str:
    """One line; ``now`` adds what is true only at this moment (free memory, load)."""
    cores = f"{machine['usable_cores']}/{machine['cores']} cores"
    line = f"{machine['cpu_model']}, {cores}, {machine['mem_gib']} GiB RAM"
    if now:
        line += f" ({machine['mem_available_gib']} GiB available), load {machine['loadavg']}"
    return line


def other_swarmnode_processes(script: str) -> list[str]:
    """Command lines of swarmnode processes this script did not start (they compete for the CPU)."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if "swarmnode" in cmd and script not in cmd and ppid != me:
            found.append(f"pid {entry.name}: {cmd[:160]}")
    return found


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


def drop_checkpoints(run_dirs: list[Path]) -> None:
    """Delete the checkpoints of finished experiment runs, whose results are their metrics.jsonl: a
    SmolLM2-135M checkpoint is 1.6 GB, and one experiment of 32 node runs filled a disk with them."""
    freed = 0
    for run_dir in run_dirs:
        folder = run_dir / "checkpoints"
        if folder.is_dir():
            freed += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            shutil.rmtree(folder)
    if freed:
        print(f"removed {freed / 1e9:.1f} GB of checkpoints of finished runs", flush=True)


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


def wait_all(nodes: list[NodeProc], limit: float) -> bool:
    """Wait for every node to exit by the monotonic time ``limit``; True if one was still running."""
    for node in nodes:
        try:
            node.proc.wait(timeout=max(limit - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            return True
    return False


def record_exit(info: dict, nodes: list[NodeProc], t0: float) -> None:
    """Exit codes, wall time since the monotonic ``t0`` and the load, into a run's ``info``."""
    info["exit_codes"] = [node.proc.returncode for node in nodes]
    info["wall_s"] = round(time.monotonic() - t0, 1)
    info["load_after"] = os.getloadavg()
