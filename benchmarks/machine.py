"""What machine a benchmark ran on, and which swarmnode processes competed for it (every report says so)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


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
