"""Soak: many tiny nodes for many rounds on one machine; memory and open files must stay flat.

It starts N real ``swarmnode join`` processes on 127.0.0.1 (node_configs/tiny.yaml, one torch thread
each, a checkpoint every ``--checkpoint-every`` rounds), one bootstrap and N-1 joining it, all waiting
for each other before round 1. While they run, a sampler reads every node's process tree from /proc
(psutil) every ``--period`` seconds: resident memory (RSS, and its anonymous part, RssAnon) and open
file descriptors of the node process, of its hivemind DHT process and of its p2pd, plus the node's
completed rounds (metrics.jsonl). The checks use RssAnon:
a leak grows it, while RSS also moves when the kernel reclaims and re-reads file-backed pages (shared
libraries, mapped files), which it does a lot on a machine short of memory; there is no swap here, so
anonymous pages stay resident.

Per node and round the peak of each memory series and the floor of open files while that round ran
are kept (``per_round``); the slope per round is the
least-squares fit over the rounds after ``--warmup`` (allocator and cache warm-up) and before the last
``--cooldown`` (nodes that finish leave, and their peers then stop hearing from them). Open files also
get their median rise per round (``median_rise``), which a short run checks instead of the slope: over
a few rounds one step or one round's spike (streams in flight at all its samples) moves a least-squares
slope as much as a leak does. What the
report says, per node and in all: exit code, rounds completed, the slopes (RSS KiB/round, fds/round),
error lines in the log, rejections and fetch failures, the longest share phase against the deadline,
and in how many rounds the node trained on peer groups ("keeps exchanging", from its own per-round
record: sampling status.json misses rounds shorter than the period). ``check`` turns the
report into a list of problems; the script exits 1 when there is one.

Every wait is bounded (``--time-limit``); only processes this script started are ended, by PID.

    .venv/bin/python -m benchmarks.soak --nodes 16 --rounds 50 --json runs/soak/report.json
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from benchmarks.harness.periodic import Periodic
from benchmarks.harness.processes import REPO, NodeProc, read_jsonl, start_node, stop_all

KINDS = ("node", "dht", "p2pd")
SERIES = tuple(f"{what}_{kind}" for what in ("rss", "anon", "fds") for kind in (*KINDS, "total"))
FDS_SERIES = tuple(name for name in SERIES if name.startswith("fds_"))
ERROR_MARKERS = ("Traceback", "ERROR", "CRITICAL", "Exception")


@dataclass
class Sample:
    t: float
    round: int  # rounds completed when sampled
    values: dict[str, float]


@dataclass
class NodeTrace:
    samples: list[Sample] = field(default_factory=list)


def _tree(pid: int) -> dict[str, list[psutil.Process]]:
    """The node process, its hivemind DHT process(es) and its p2pd, by kind."""
    root = psutil.Process(pid)
    kinds: dict[str, list[psutil.Process]] = {"node": [root], "dht": [], "p2pd": []}
    for child in root.children(recursive=True):
        try:
            kinds["p2pd" if "p2pd" in child.name() else "dht"].append(child)
        except psutil.Error:
            continue
    return kinds


def _rss_anon_kib(pid: int) -> float:
    """RssAnon of a process, in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def sample_node(node: NodeProc) -> Sample | None:
    """One reading of a running node's process tree; None once it has exited."""
    if node.proc.poll() is not None:
        return None
    values = dict.fromkeys(SERIES, 0.0)
    try:
        for kind, procs in _tree(node.proc.pid).items():
            for proc in procs:
                try:
                    with proc.oneshot():
                        values[f"rss_{kind}"] += proc.memory_info().rss / 1024
                        values[f"anon_{kind}"] += _rss_anon_kib(proc.pid)
                        values[f"fds_{kind}"] += proc.num_fds()
                except psutil.Error:
                    continue
    except psutil.Error:
        return None
    for what in ("rss", "anon", "fds"):
        values[f"{what}_total"] = sum(values[f"{what}_{kind}"] for kind in KINDS)
    return Sample(time.time(), _count_lines(node.run_dir / "metrics.jsonl"), values)


class Sampler(Periodic):
    """Samples every node's process tree in a thread until ``stop``."""

    def __init__(self, nodes: list[NodeProc], period_s: float):
        super().__init__(period_s, at_once=True, join_s=30.0)
        self.nodes = nodes
        self.traces = [NodeTrace() for _ in nodes]

    def tick(self) -> None:
        for node, trace in zip(self.nodes, self.traces, strict=True):
            sample = sample_node(node)
            if sample is not None:
                trace.samples.append(sample)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two points)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def median_rise(values: dict[int, float], rounds: list[int]) -> float:
    """Median change per round between consecutive rounds: a leak of k a round makes it k, while a
    one-off step or a one-round spike leaves it 0 as long as fewer than half the rounds move."""
    rises = [(values[b] - values[a]) / (b - a) for a, b in itertools.pairwise(rounds)]
    return statistics.median(rises) if rises else 0.0


def per_round(trace: NodeTrace, name: str) -> dict[int, float]:
    """Peak of a memory series, floor of open files, while each round ran (samples taken with r rounds
    completed belong to round r+1). A leak raises the floor of open files; streams in flight (pulls and
    notices go on in the background while a node samples and trains) raise only the peaks."""
    pick = min if name.startswith("fds_") else max
    values: dict[int, float] = {}
    for s in trace.samples:
        r = s.round + 1
        values[r] = pick(values[r], s.values[name]) if r in values else s.values[name]
    return values


def trace_stats(trace: NodeTrace, window: range) -> dict:
    """Per series over the window: slope, first, last and max, and the median rise of open files."""
    out: dict = {}
    for name in SERIES:
        peaks = per_round(trace, name)
        xs = [r for r in window if r in peaks]
        out[f"{name}_slope"] = round(slope(xs, [peaks[r] for r in xs]), 2)
        if name in FDS_SERIES:
            out[f"{name}_rise"] = round(median_rise(peaks, xs), 2)
        out[f"{name}_first"] = peaks.get(xs[0]) if xs else None
        out[f"{name}_last"] = peaks.get(xs[-1]) if xs else None
        out[f"{name}_max"] = max(peaks.values(), default=None)
    return out


def analyse_node(
    node: NodeProc, trace: NodeTrace, *, rounds: int, warmup: int, cooldown: int, deadline_s: float
) -> dict:
    records = read_jsonl(node.run_dir / "metrics.jsonl")
    window = range(warmup + 1, rounds - cooldown + 1)
    out: dict = {"run_dir": str(node.run_dir), "exit_code": node.proc.returncode, "rounds": len(records)}
    out.update(trace_stats(trace, window))
    exchanged = sum(1 for r in records if r["round"] in window and r["groups_peer"] > 0)
    out["rounds_exchanging"] = exchanged
    out["window_rounds"] = len(window)
    out["max_share_s"] = round(max((r["seconds_share"] for r in records), default=0.0), 2)
    out["over_deadline_rounds"] = sum(1 for r in records if r["seconds_share"] > deadline_s + 2.0)
    out["error_lines"] = [line for line in node.lines if any(m in line for m in ERROR_MARKERS)][:20]
    try:
        status = json.loads((node.run_dir / "status.json").read_text())
    except (OSError, ValueError):
        status = {}
    out["rejected"] = status.get("rejected", {})
    out["fetch_failures"] = status.get("fetch_failures", {})
    out["groups_accepted"] = status.get("rollouts", {}).get("groups_accepted", 0)
    out["peers_known"] = len(status.get("peers", {}))
    return out


def summarise(nodes: list[dict]) -> dict:
    def stats(key: str) -> dict:
        values = [n[key] for n in nodes if n.get(key) is not None]
        if not values:
            return {}
        return {"mean": round(sum(values) / len(values), 2), "max": max(values), "min": min(values)}

    return {
        **{f"{name}_slope": stats(f"{name}_slope") for name in SERIES},
        **{f"{name}_rise": stats(f"{name}_rise") for name in FDS_SERIES},
        "rss_total_last_kib": stats("rss_total_last"),
        "anon_total_last_kib": stats("anon_total_last"),
        "fds_total_last": stats("fds_total_last"),
        "max_share_s": max((n["max_share_s"] for n in nodes), default=0.0),
        "rounds_completed": stats("rounds"),
        "rounds_exchanging": stats("rounds_exchanging"),
        "error_lines": sum(len(n["error_lines"]) for n in nodes),
        "rejected": sum(sum(n["rejected"].values()) for n in nodes),
        "fetch_failures": sum(sum(n["fetch_failures"].values()) for n in nodes),
    }


def run_soak(
    workdir: Path,
    *,
    nodes: int,
    rounds: int,
    deadline_s: float = 10.0,
    checkpoint_every: int = 10,
    warmup: int = 5,
    cooldown: int = 2,
    period_s: float = 2.0,
    time_limit_s: float = 2400.0,
    config: Path = REPO / "node_configs" / "tiny.yaml",
) -> dict:
    """Run the soak and return its report (see the module docstring)."""
    swarm_id = f"soak-{nodes}-{os.getpid()}"
    args = [
        "--config", str(config),
        "--rounds", str(rounds),
        "--set", f"swarm.swarm_id={swarm_id}",
        "--set", f"swarm.min_peers={nodes - 1}",
        "--set", f"swarm.wait_for_peers_s={min(600.0, time_limit_s)}",
        "--set", f"swarm.share_deadline_s={deadline_s}",
        "--set", f"run.checkpoint_every={checkpoint_every}",
        "--set", "run.cpu_threads=1",
    ]  # fmt: skip
    procs: list[NodeProc] = []
    started = time.monotonic()
    timed_out = False
    sampler: Sampler | None = None
    try:
        procs.append(start_node(workdir / "node00", *args))
        bootstrap = procs[0].address(timeout_s=min(300.0, time_limit_s))
        for i in range(1, nodes):
            procs.append(start_node(workdir / f"node{i:02d}", *args, peers=[bootstrap]))
        sampler = Sampler(procs, period_s).start()
        for node in procs:
            remaining = started + time_limit_s - time.monotonic()
            try:
                node.proc.wait(timeout=max(remaining, 0.1))
            except Exception:
                timed_out = True
                break
    finally:
        if sampler is not None:
            sampler.stop()
        stop_all(procs)
    traces = sampler.traces if sampler is not None else [NodeTrace() for _ in procs]
    per_node = [
        analyse_node(node, trace, rounds=rounds, warmup=warmup, cooldown=cooldown, deadline_s=deadline_s)
        for node, trace in zip(procs, traces, strict=True)
    ]
    for node in procs:  # each node's log, for a look afterwards
        (node.run_dir / "node.log").write_text("\n".join(node.lines) + "\n")
    return {
        "nodes": nodes,
        "rounds": rounds,
        "deadline_s": deadline_s,
        "warmup": warmup,
        "cooldown": cooldown,
        "timed_out": timed_out,
        "wall_s": round(time.monotonic() - started, 1),
        "summary": summarise(per_node),
        "per_node": per_node,
    }


def check(
    report: dict,
    *,
    max_rss_slope_kib: float,
    max_fds_slope: float | None = None,
    max_fds_rise: float | None = None,
) -> list[str]:
    """Everything that makes the soak a failure, as readable lines ([] = it held). Open files are bounded
    by their least-squares slope (long runs) and/or by the median rise of each process (short runs)."""
    problems = []
    if report["timed_out"]:
        problems.append("the soak ran past its time limit")
    for n in report["per_node"]:
        name = Path(n["run_dir"]).name
        if n["exit_code"] != 0 or n["rounds"] != report["rounds"]:
            problems.append(f"{name}: exit {n['exit_code']} after {n['rounds']}/{report['rounds']} rounds")
        if n["error_lines"]:
            problems.append(f"{name}: error lines, first: {n['error_lines'][0]}")
        if n["rejected"]:
            problems.append(f"{name}: honest data rejected: {n['rejected']}")
        if n["over_deadline_rounds"]:
            problems.append(f"{name}: {n['over_deadline_rounds']} rounds waited past the deadline")
        if n["rounds_exchanging"] < n["window_rounds"] * 0.8:
            problems.append(f"{name}: trained on peer groups in only {n['rounds_exchanging']} rounds")
        if n["anon_total_slope"] > max_rss_slope_kib:
            problems.append(f"{name}: anonymous memory grows {n['anon_total_slope']} KiB/round")
        if max_fds_slope is not None and n["fds_total_slope"] > max_fds_slope:
            problems.append(f"{name}: open files grow {n['fds_total_slope']} per round")
        for series in FDS_SERIES if max_fds_rise is not None else ():
            if n[f"{series}_rise"] > max_fds_rise:
                kind = series.removeprefix("fds_")
                problems.append(f"{name}: open files of {kind} rise {n[f'{series}_rise']} in a typical round")
    return problems
