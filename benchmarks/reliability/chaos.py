"""Chaos: a tiny-model swarm on one machine while nodes are killed, checkpoints corrupted, a disk fills up
and a clock jumps. What must hold: no honest node crashes or waits past its deadline, every restarted
node resumes from its newest valid checkpoint, a corrupt checkpoint is reported and skipped, no round
is lost (every node ends with rounds 1..R logged exactly once), and a full disk costs checkpoints, not
the node.

Topology: a ``swarmnode bootstrap`` (DHT only, as on the public network; never killed) that every node
joins through, restarted ones included. Timeline, once every node has logged 2 rounds: the first kill;
then node01's clock jumps forward by ``clock_jump_s`` (``_clock_jump.py``) and node02's run folder, on a
small tmpfs, fills up (all but ~256 KiB), both for two of their rounds; then the other kills. Any node
may be killed: a random running node is SIGKILLed, by PID, at a random moment of a round; every other
kill (the first, third, ...) also corrupts the newest checkpoint it left behind; the node is restarted
in the same folder at once.

The report has per node: exit code, rounds logged, longest share phase, checkpoint failures seen; per
kill: victim, rounds logged at the kill, the newest valid checkpoint at restart, the round the restarted
node resumed from, whether the corrupt checkpoint was reported, seconds from restart to its next round;
and the totals (max stall, rounds lost). ``problems`` lists everything that did not hold.

Needs root for the tmpfs (``disk_full=False`` skips that part). Every wait is bounded; only processes
this script started are ended, by PID; the tmpfs is unmounted on the way out.

    .venv/bin/python -m benchmarks.chaos --nodes 8 --rounds 12 --kills 4 --json runs/chaos/report.json
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.harness.processes import (
    CLOCK_JUMP,
    REPO,
    NodeProc,
    read_jsonl,
    start_bootstrap,
    start_node,
    stop_all,
)
from benchmarks.harness.waiting import wait_until
from swarmnode import checkpoint

SLACK_S = 2.0  # a poll or a verification may still be finishing when the deadline passes
ROUND_RE = re.compile(r"^round\s+(\d+)\s")
RESUMED_RE = re.compile(r"resumed from (\S+) at round (\d+)")
DISK_HEADROOM = 256 * 1024  # bytes left free on the full disk: round logs fit, a checkpoint (~2 MB) not
FILL_CHUNK = 4 * 1024 * 1024
FILL_CHUNKS_MAX = 64  # the tmpfs is 48 MiB


@dataclass
class KillRecord:
    node: str
    rounds_logged: int  # rounds in metrics.jsonl when it was killed
    newest_valid: int  # newest valid checkpoint round when it was restarted (0: none)
    corrupted: int | None  # the checkpoint round this kill corrupted, if any
    resumed: int | None = None  # the round the restarted node said it resumed from
    corrupt_reported: bool | None = None  # it said it skipped the corrupt checkpoint, and why


def _rounds_logged(node: NodeProc) -> int:
    return sum(1 for line in node.lines if ROUND_RE.match(line))


def _checkpoint_failures(lines: list[str]) -> int:
    """The node's "checkpoint of round N failed (...)" warnings."""
    return sum("checkpoint of round" in line and "failed" in line for line in lines)


def _corrupt_newest(run_dir: Path) -> int | None:
    """Flip one byte in the middle of the newest checkpoint's weights; its round (None if none)."""
    info = checkpoint.newest_valid(run_dir / "checkpoints", log=lambda _: None)
    if info is None:
        return None
    weights = info.path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    return info.round


@contextlib.contextmanager
def _tmpfs(path: Path, size_mib: int):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


class Chaos:
    """One chaos run (see the module docstring); ``run`` returns the report."""

    def __init__(
        self, workdir: Path, *, nodes: int, rounds: int, kills: int, deadline_s: float, checkpoint_every: int,
        clock_jump_s: float, disk_full: bool, seed: int, time_limit_s: float,
    ):  # fmt: skip
        if nodes < 3:
            raise ValueError("chaos needs at least 3 nodes (clock, disk and one more)")
        self.workdir, self.n, self.rounds, self.kills = workdir, nodes, rounds, kills
        self.deadline_s, self.clock_jump_s, self.disk_full = deadline_s, clock_jump_s, disk_full
        self.checkpoint_every, self.time_limit_s = checkpoint_every, time_limit_s
        self.rng = random.Random(seed)
        self.swarm_id = f"chaos-{os.getpid()}-{seed}"
        self.offset_file = workdir / "clock_offset"
        self.disk = workdir / "disk"
        self.dirs = {f"node{i:02d}": workdir / f"node{i:02d}" for i in range(nodes)}
        if disk_full:
            self.dirs["node02"] = self.disk / "node02"
        self.procs: dict[str, NodeProc] = {}
        self.bootstrap: NodeProc | None = None
        self.retired: list[NodeProc] = []  # killed processes (their output is kept for the report)
        self.kill_records: list[KillRecord] = []
        self.events: list[str] = []
        self.started = time.monotonic()

    # -- processes ---------------------------------------------------------------------------------
    def _args(self, min_peers: int, wait_s: float) -> list[str]:
        return [
            "--config", str(REPO / "node_configs" / "tiny.yaml"),
            "--rounds", str(self.rounds),
            "--set", f"swarm.swarm_id={self.swarm_id}",
            "--set", f"swarm.min_peers={min_peers}",
            "--set", f"swarm.wait_for_peers_s={wait_s}",
            "--set", f"swarm.share_deadline_s={self.deadline_s}",
            "--set", f"run.checkpoint_every={self.checkpoint_every}",
            "--set", "run.keep_checkpoints=3",
            "--set", "run.cpu_threads=1",
        ]  # fmt: skip

    def _start(self, name: str, peers: list[str], *, restart: bool = False) -> NodeProc:
        """First start: wait for the whole swarm; a restart: for one peer, briefly (others may be done)."""
        prefix = [sys.executable, str(CLOCK_JUMP), str(self.offset_file)] if name == "node01" else []
        args = self._args(1, 30) if restart else self._args(self.n - 1, 240)
        node = start_node(self.dirs[name], *args, peers=peers, prefix=prefix)
        self.procs[name] = node
        return node

    def _event(self, text: str) -> None:
        self.events.append(f"{time.monotonic() - self.started:7.1f}s {text}")
        print(self.events[-1], flush=True)

    def _running(self) -> list[str]:
        return [name for name, node in self.procs.items() if node.proc.poll() is None]

    def _out_of_time(self) -> bool:
        return time.monotonic() - self.started > self.time_limit_s

    # -- faults ------------------------------------------------------------------------------------
    def _until_rounds(self, name: str, total: int) -> bool:
        """Wait (bounded) until node ``name`` has logged ``total`` rounds, or has exited."""
        node = self.procs[name]
        return wait_until(lambda: _rounds_logged(node) >= total or node.proc.poll() is not None, 300, 0.5)

    def _after_rounds(self, name: str, count: int) -> bool:
        return self._until_rounds(name, _rounds_logged(self.procs[name]) + count)

    def _jump_clock(self, seconds: float) -> None:
        self.offset_file.write_text(str(seconds))
        self._event(f"node01 clock set {seconds:+.0f} s off true time")

    def _fill_disk(self) -> Path:
        """Fill the disk to ~DISK_HEADROOM free, in chunks sized from the free space as it is then (node02
        keeps writing meanwhile: one write sized from an earlier look hit ENOSPC in CI), then give back
        what the node's own writes took from the headroom."""
        filler = self.disk / "filler"
        with filler.open("wb", buffering=0) as f:
            for _ in range(FILL_CHUNKS_MAX):
                chunk = min(self._free_bytes() - DISK_HEADROOM, FILL_CHUNK)
                if chunk <= 0:
                    break
                try:
                    f.write(b"\0" * chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
            short = DISK_HEADROOM - self._free_bytes()
            if short > 0:
                f.truncate(max(f.tell() - short, 0))
        self._event(f"node02 disk filled ({filler.stat().st_size} bytes written, ~{DISK_HEADROOM} left)")
        return filler

    def _free_bytes(self) -> int:
        stats = os.statvfs(self.disk)
        return stats.f_bavail * stats.f_frsize

    def _kill_one(self, bootstrap: str, spare: str = "") -> bool:
        """SIGKILL a random running node (not ``spare``) mid-round, maybe corrupt its newest checkpoint,
        restart it. False when no node is left to kill (all near their last round)."""
        candidates = [n for n in self._running() if 2 <= _rounds_logged(self.procs[n]) < self.rounds - 1]
        candidates = [n for n in candidates if n != spare]
        if not candidates:
            return False
        name = self.rng.choice(candidates)
        victim = self.procs[name]
        logged = _rounds_logged(victim)
        wait_until(lambda: _rounds_logged(victim) > logged, 60, 0.5)  # a round ended: kill during the next
        time.sleep(self.rng.uniform(0.2, 3.0))
        if victim.proc.poll() is not None:
            return True
        victim.kill()  # SIGKILL, by PID
        self.retired.append(victim)
        corrupted = _corrupt_newest(self.dirs[name]) if len(self.kill_records) % 2 == 0 else None
        info = checkpoint.newest_valid(self.dirs[name] / "checkpoints", log=lambda _: None)
        record = KillRecord(name, len(read_jsonl(self.dirs[name] / "metrics.jsonl")),
                            info.round if info else 0, corrupted)  # fmt: skip
        self.kill_records.append(record)
        self._event(f"SIGKILL {name} after {record.rounds_logged} rounds; corrupted checkpoint {corrupted}")
        self._start(name, [bootstrap], restart=True)
        return True

    def _restarts(self) -> list[NodeProc]:
        """The process started after each kill, in kill order (the next one of that run folder)."""
        runs = [*self.retired, *self.procs.values()]
        out = []
        for i, killed in enumerate(self.retired):
            out.append(next(p for p in runs[i + 1 :] if p.run_dir == killed.run_dir))
        return out

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> dict:
        self.offset_file.write_text("0")
        mount = _tmpfs(self.disk, 48) if self.disk_full else contextlib.nullcontext()
        timed_out = False
        with mount:
            try:
                self.bootstrap = start_bootstrap(
                    self.workdir / "bootstrap", "--set", 'bootstrap.host_maddrs=["/ip4/127.0.0.1/tcp/0"]'
                )
                bootstrap = self.bootstrap.address(timeout_s=180)
                for i in range(self.n):
                    self._start(f"node{i:02d}", [bootstrap])
                for name in self.procs:
                    self._until_rounds(name, 2)
                jumped_at = _rounds_logged(self.procs["node01"])
                self._jump_clock(self.clock_jump_s)
                filler = self._fill_disk() if self.disk_full else None
                if filler is not None:  # freed once a checkpoint has failed on it, before its next one
                    disk_node = self.procs["node02"]
                    wait_until(
                        lambda: _checkpoint_failures(disk_node.lines) or disk_node.proc.poll() is not None,
                        300,
                        period_s=0.05,  # tiny rounds take ~0.3 s: free it before the next checkpoint
                    )
                    filler.unlink()
                    self._event("node02 disk freed")
                kills = int(self.kills > 0 and self._kill_one(bootstrap, spare="node01"))
                self._until_rounds("node01", jumped_at + 2)
                self._jump_clock(0.0)
                while kills < self.kills and not self._out_of_time() and self._kill_one(bootstrap):
                    kills += 1
                for node in list(self.procs.values()):
                    remaining = self.started + self.time_limit_s - time.monotonic()
                    try:
                        node.proc.wait(timeout=max(remaining, 0.1))
                    except subprocess.TimeoutExpired:
                        timed_out = True
                        break
            finally:
                stop_all([*self.procs.values(), *([self.bootstrap] if self.bootstrap else [])])
            return self._report(timed_out)  # before the tmpfs goes

    def _report(self, timed_out: bool) -> dict:
        for record, node in zip(self.kill_records, self._restarts(), strict=True):
            resumed = [m for m in map(RESUMED_RE.search, node.lines) if m]
            record.resumed = int(resumed[0].group(2)) if resumed else 0
            if record.corrupted is not None:
                record.corrupt_reported = any(
                    "skipping" in line and "checksum" in line for line in node.lines
                )
        per_node = {}
        for name, node in self.procs.items():
            records = read_jsonl(self.dirs[name] / "metrics.jsonl")
            lines = [line for p in [*self.retired, node] if p.run_dir == node.run_dir for line in p.lines]
            (self.workdir / f"{name}.log").write_text("\n".join(lines) + "\n")  # every run of the node
            final = checkpoint.newest_valid(self.dirs[name] / "checkpoints", log=lambda _: None)
            per_node[name] = {
                "exit_code": node.proc.returncode,
                "rounds": [r["round"] for r in records],
                "max_share_s": round(max((r["seconds_share"] for r in records), default=0.0), 2),
                "final_checkpoint": final.round if final else None,
                "checkpoint_failures": _checkpoint_failures(lines),
                "tracebacks": sum("Traceback" in line for line in node.lines),
                "rejected": _status(self.dirs[name]).get("rejected", {}),
            }
        expected = list(range(1, self.rounds + 1))
        lost = sum(len(set(expected) - set(n["rounds"])) for n in per_node.values())
        return {
            "nodes": self.n, "rounds": self.rounds, "deadline_s": self.deadline_s, "timed_out": timed_out,
            "wall_s": round(time.monotonic() - self.started, 1), "events": self.events,
            "kills": [asdict(k) for k in self.kill_records], "per_node": per_node,
            "max_share_s": max(n["max_share_s"] for n in per_node.values()),
            "rounds_lost": lost,
            "rounds_rerun": sum(max(k.rounds_logged - (k.resumed or 0), 0) for k in self.kill_records),
        }  # fmt: skip


def _status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def check(report: dict) -> list[str]:
    """Everything that did not hold, as readable lines ([] = it held)."""
    problems = []
    if report["timed_out"]:
        problems.append("ran past its time limit")
    expected = list(range(1, report["rounds"] + 1))
    for name, n in report["per_node"].items():
        if n["exit_code"] != 0 or n["tracebacks"]:
            problems.append(f"{name}: exit {n['exit_code']}, {n['tracebacks']} traceback(s)")
        if n["rounds"] != expected:
            problems.append(f"{name}: rounds logged {n['rounds']}")
        if n["final_checkpoint"] != report["rounds"]:
            problems.append(f"{name}: final checkpoint {n['final_checkpoint']}")
        if n["max_share_s"] > report["deadline_s"] + SLACK_S:
            problems.append(
                f"{name}: waited {n['max_share_s']} s for peers (deadline {report['deadline_s']})"
            )
        if n["rejected"]:
            problems.append(f"{name}: honest data rejected: {n['rejected']}")
    for k in report["kills"]:
        if k["resumed"] != k["newest_valid"]:
            problems.append(f"{k['node']}: resumed from {k['resumed']}, newest valid was {k['newest_valid']}")
        if k["corrupted"] is not None and not k["corrupt_reported"]:
            problems.append(f"{k['node']}: corrupt checkpoint {k['corrupted']} not reported")
    if (
        "node02" in report["per_node"]
        and report.get("disk_full")
        and not report["per_node"]["node02"]["checkpoint_failures"]
    ):
        problems.append("node02: the full disk never made a checkpoint fail (was the fault injected?)")
    if report["rounds_lost"]:
        problems.append(f"{report['rounds_lost']} rounds lost")
    return problems


def run_chaos(workdir: Path, **kwargs) -> dict:
    chaos = Chaos(workdir, **kwargs)
    report = chaos.run()
    report["disk_full"] = kwargs["disk_full"]
    report["problems"] = check(report)
    return report
