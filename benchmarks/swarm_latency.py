"""Swarm sharing benchmark: publish -> arrival latency and the share of round time spent on sharing.

For each swarm size N it starts N real ``swarmnode join`` processes on 127.0.0.1 with the tiny model
(node_configs/tiny.yaml, one torch thread each): one bootstrap, the others joining it, all waiting for
N-1 peers before round 1 so they start together. Every node writes the opt-in timing trace of
swarmnode/swarm/exchange/records.py (``SWARMNODE_SHARE_TRACE=1`` -> ``<run_dir>/share.jsonl``) and its
metrics.jsonl; once all nodes finish, the two are joined:

- latency of a (batch, receiver) pair = receiver's "bytes fetched" time - publisher's publish start
  (the moment it began building the signed batch; batch.timestamp is taken microseconds later). All
  nodes run on one machine, so their wall clocks agree. "+verify" adds the receiver's verification.
  Receivers pull in the background (swarm/exchange/service.py); where the time goes: "discover" (publish ->
  the receiver knew of it, by notice or DHT poll), "queue" (-> its pull began: free pull slots,
  back-offs), "fetch", "verify"; and how batches were found (notice / poll) and served (a holder that
  is not the author).
- "used by" latency = the arrival at a receiver that trained on a group of the batch (its
  peer_groups.jsonl): what matters once a node pulls only K batches a round (#27), not every one;
- "every peer" latency of a batch = the latest of its N-1 arrivals (a missing arrival counts as never);
  "before next round" = that all N-1 arrivals happened before the publisher began its next round
  (its exchange end + train + weight sync); "before next batch" = before it published its next batch
  (the end of its next round's sampling): no peer's copy is more than one round stale. A round no longer
  waits for every peer (only while its pool lacks J fresh groups), so the first can end within a
  training step of the publish.
- work per round: each node's notices sent and received, pulls, verifications (batches received) and
  bytes in and out per round (its metrics.jsonl ``peer_*`` counts), averaged over nodes, and the share
  of rounds that trained on J peer groups (and what ended the wait of those that did not): what must
  stay flat as the swarm grows (#27); and whether the nodes formed one swarm or cohorts
  (benchmarks/harness/cohorts.py).
- share of round = sum(seconds_share) / sum(seconds_total) per node, averaged over nodes; "net share"
  subtracts from seconds_share the time the node was only waiting for the last peer of the round to
  publish at all (a straggler still sampling), which no network can remove.

The first --warmup rounds (first-call overheads) and the last --cooldown rounds are left out: a node
that has finished leaves the swarm, the DHT records it held (other nodes' roster cards and
announcements) go with it, and nodes still in their last round then stop waiting for some peers. Every
wait is bounded; only processes this script started are ended, by PID. Usage:

    .venv/bin/python -m benchmarks.swarm_latency --nodes 4 8 16 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.common import record_exit, wait_all
from benchmarks.harness.cohorts import cohorts
from benchmarks.harness.processes import NodeProc, read_jsonl, start_node, stop_all
from benchmarks.machine import describe_machine, machine_info
from swarmnode.config import load_config
from swarmnode.swarm.exchange.records import PEER_GROUPS_FILE, SHARE_TRACE_ENV, TRAFFIC

REPO = Path(__file__).resolve().parents[1]
BREAKDOWN = ("discover", "queue", "fetch", "verify")  # where a (batch, receiver) pair's arrival time goes


# ---------------------------------------------------------------------------------------------------
# running one swarm
# ---------------------------------------------------------------------------------------------------
def node_args(n: int, args: argparse.Namespace, swarm_id: str) -> list[str]:
    """Every node's command line: all other nodes awaited, or as many as a ``--view`` can hold."""
    awaited = n - 1 if args.view is None else min(n - 1, args.view - 1)
    view = [] if args.view is None else ["--set", f"swarm.view_size={args.view}"]
    return [
        "--config", str(args.config),
        "--rounds", str(args.rounds),
        "--set", f"swarm.swarm_id={swarm_id}",
        "--set", f"swarm.min_peers={awaited}",
        "--set", f"swarm.wait_for_peers_s={args.startup_timeout}",
        "--set", f"swarm.share_deadline_s={args.deadline}",
        "--set", "run.checkpoint_every=100000",  # only the final checkpoint: no disk work between rounds
        *view,
    ]  # fmt: skip


def run_swarm(n: int, args: argparse.Namespace, workdir: Path) -> tuple[list[Path], dict]:
    """Run an n-node swarm to completion (or to its time limit); returns the run dirs and run info."""
    swarm_id = f"bench-{n}-{os.getpid()}"
    root = workdir / f"n{n}"
    if root.exists():
        shutil.rmtree(root)
    dirs = [root / f"node{i:02d}" for i in range(n)]
    os.environ[SHARE_TRACE_ENV] = "1"
    nodes: list[NodeProc] = []
    info = {"nodes": n, "exit_codes": [], "timed_out": False, "load_before": os.getloadavg()}
    t0 = time.monotonic()
    try:
        nodes.append(start_node(dirs[0], *node_args(n, args, swarm_id)))
        bootstrap = nodes[0].address(timeout_s=args.startup_timeout)
        for d in dirs[1:]:
            nodes.append(start_node(d, *node_args(n, args, swarm_id), peers=[bootstrap]))
        info["timed_out"] = wait_all(nodes, t0 + args.startup_timeout + args.rounds * args.round_timeout)
    finally:
        stop_all(nodes)
    record_exit(info, nodes, t0)
    failed = [(d, node) for d, node in zip(dirs, nodes, strict=False) if node.proc.returncode != 0]
    for d, node in failed[:2]:
        code = node.proc.returncode
        print(f"--- node {d.name} exited {code}; last output:\n{node.output()}", file=sys.stderr)
    return dirs, info


# ---------------------------------------------------------------------------------------------------
# analysis
# ---------------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (inf values allowed: they sort last)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def work_per_round(nodes: list[dict], first: int, last: int, wanted: int) -> dict:
    """A node's network work per round (#27: it must not grow with the swarm), the mean over every
    (node, round) of ``first``..``last``: notices sent and received, pulls, verifications (batches
    received) and bytes, each with its largest node's mean; and the share of rounds that trained on
    ``wanted`` (J) peer groups."""
    rows = [node["metrics"][r] for node in nodes for r in range(first, last + 1) if r in node["metrics"]]
    keys = {f"peer_{name}": name for name in TRAFFIC} | {"peer_batches_received": "verifications"}
    out: dict = {}
    for key, name in keys.items():
        per_node = [
            statistics.mean(
                node["metrics"][r].get(key, 0) for r in range(first, last + 1) if r in node["metrics"]
            )
            for node in nodes
            if any(r in node["metrics"] for r in range(first, last + 1))
        ]
        out[name] = statistics.mean(per_node) if per_node else float("nan")
        out[f"{name}_max_node"] = max(per_node, default=float("nan"))
    out["rounds_filling_j"] = (
        sum(r.get("groups_peer", 0) >= wanted for r in rows) / len(rows) if rows else float("nan")
    )
    # what ended the wait of each round that took fewer than J (the share trace's ``ended_by``)
    out["short_rounds_ended_by"] = dict(
        Counter(
            node["exchange"].get(r, {}).get("ended_by", "unknown")
            for node in nodes
            for r in range(first, last + 1)
            if r in node["metrics"] and node["metrics"][r].get("groups_peer", 0) < wanted
        )
    )
    return out


def analyse(dirs: list[Path], first: int, last: int, wanted: int = 4) -> dict:
    """Statistics over rounds ``first``..``last`` (inclusive) of the run folders ``dirs``; ``wanted`` is
    the swarm's J (peer groups per round)."""
    nodes = []
    for d in dirs:
        try:
            peer = json.loads((d / "status.json").read_text())["peer_id"]
        except (OSError, ValueError, KeyError):
            continue
        events = read_jsonl(d / "share.jsonl")
        nodes.append(
            {
                "peer": peer,
                "metrics": {r["round"]: r for r in read_jsonl(d / "metrics.jsonl")},
                "publish": {e["round"]: e for e in events if e["event"] == "publish"},
                "exchange": {e["round"]: e for e in events if e["event"] == "exchange"},
                "batches": [e for e in events if e["event"] == "batch"],
                # (producer, its round) of every peer group trained on
                "trained": {(g["producer"], g["producer_round"]) for g in read_jsonl(d / PEER_GROUPS_FILE)},
            }
        )
    by_peer = {node["peer"]: node for node in nodes}
    n = len(nodes)

    # -- latency per (batch, receiver) ------------------------------------------------------------
    arrivals: dict[tuple[str, int], dict[str, dict]] = {}  # (publisher, round) -> receiver -> event
    failures = 0
    for node in nodes:
        for e in node["batches"]:
            if "error" in e:
                failures += 1
                continue
            arrivals.setdefault((e["peer"], e["round"]), {})[node["peer"]] = e
    lat, lat_verified, parts = [], [], {k: [] for k in BREAKDOWN}
    used_parts = {k: [] for k in BREAKDOWN}  # the same, of the arrivals that were trained on
    sources: dict[str, int] = {"notice": 0, "poll": 0, "holder": 0}
    used_by_notice = 0
    every, before_next, before_next_batch, expected = [], [], [], 0
    used = []  # publish -> arrival at a receiver that trained on a group of that batch
    for pub in nodes:
        for r, p in pub["publish"].items():
            if not first <= r <= last:
                continue
            published = p["started"]
            got = arrivals.get((pub["peer"], r), {})
            expected += n - 1
            times = []
            for rec in nodes:
                if rec is pub:
                    continue
                e = got.get(rec["peer"])
                if e is None:
                    times.append(float("inf"))
                    continue
                times.append(e["fetched"] - published)
                lat.append(e["fetched"] - published)
                lat_verified.append(e["verified"] - published)
                pair = {
                    "discover": e["seen"] - published,  # the notice arrived, or the poll showed it
                    "queue": e["fetch_started"] - e["seen"],  # pull slots busy, holder backed off
                    "fetch": e["fetched"] - e["fetch_started"],
                    "verify": e["verified"] - e["fetched"],
                }
                for k, v in pair.items():
                    parts[k].append(v)
                sources[e.get("via", "poll")] += 1
                sources["holder"] += e.get("holder", e["peer"]) != e["peer"]
                if (pub["peer"], r) in rec["trained"]:
                    used.append(e["fetched"] - published)
                    used_by_notice += e.get("via", "poll") == "notice"
                    for k, v in pair.items():
                        used_parts[k].append(v)
            worst = max(times) if times else float("nan")
            every.append(worst)
            rec_m, ex = pub["metrics"].get(r), pub["exchange"].get(r)
            if rec_m and ex and worst != float("inf"):
                next_start = ex["ended"] + rec_m["seconds_train"] + rec_m["seconds_sync"]
                before_next.append(published + worst <= next_start)
            else:
                before_next.append(False)
            if r + 1 in pub["publish"]:
                before_next_batch.append(published + worst <= pub["publish"][r + 1]["started"])

    # -- share of round time --------------------------------------------------------------------
    shares, net_shares, totals, share_s, net_share_s = [], [], [], [], []
    for node in nodes:
        rounds = [r for r in node["metrics"] if first <= r <= last]
        if not rounds:
            continue
        tot = sum(node["metrics"][r]["seconds_total"] for r in rounds)
        shr = sum(node["metrics"][r]["seconds_share"] for r in rounds)
        barrier = 0.0
        for r in rounds:
            ex = node["exchange"].get(r)
            last_pub = max(
                (o["publish"][r]["started"] for o in nodes if o is not node and r in o["publish"]),
                default=None,
            )
            wait = 0.0
            if ex and last_pub is not None:
                wait = min(max(last_pub - ex["started"], 0.0), ex["ended"] - ex["started"])
            barrier += wait
            net_share_s.append(max(node["metrics"][r]["seconds_share"] - wait, 0.0))
        shares.append(shr / tot)
        net_shares.append(max(shr - barrier, 0.0) / tot)
        totals += [node["metrics"][r]["seconds_total"] for r in rounds]
        share_s += [node["metrics"][r]["seconds_share"] for r in rounds]
    stores = [
        p["stored"] - p["started"] for node in nodes for r, p in node["publish"].items() if first <= r <= last
    ]
    return {
        "nodes_reporting": n,
        "by_peer": len(by_peer),
        "pairs_expected": expected,
        "pairs_delivered": len(lat),
        "fetch_failures": failures,
        "arrival_p50_s": pct(lat, 50),
        "arrival_p95_s": pct(lat, 95),
        "arrival_max_s": max(lat) if lat else float("nan"),
        "arrival_verified_p95_s": pct(lat_verified, 95),
        "used_p50_s": pct(used, 50),
        "used_p95_s": pct(used, 95),
        "every_peer_p50_s": pct(every, 50),
        "every_peer_p95_s": pct(every, 95),
        "batches": len(every),
        "reached_all_before_next_round": sum(before_next) / len(before_next) if before_next else float("nan"),
        "reached_all_before_next_batch": (
            sum(before_next_batch) / len(before_next_batch) if before_next_batch else float("nan")
        ),
        "share_of_round": statistics.mean(shares) if shares else float("nan"),
        "net_share_of_round": statistics.mean(net_shares) if net_shares else float("nan"),
        "round_p50_s": median(totals),
        "share_p50_s": median(share_s),
        "net_share_p50_s": median(net_share_s),
        "publish_store_p50_s": median(stores),
        "found_by_notice": sources["notice"] / len(lat) if lat else float("nan"),
        "served_by_holder": sources["holder"] / len(lat) if lat else float("nan"),
        "breakdown_p50_s": {k: median(v) for k, v in parts.items()},
        "breakdown_p95_s": {k: pct(v, 95) for k, v in parts.items()},
        "used_breakdown_p50_s": {k: median(v) for k, v in used_parts.items()},
        "used_breakdown_p95_s": {k: pct(v, 95) for k, v in used_parts.items()},
        "used_found_by_notice": used_by_notice / len(used) if used else float("nan"),
        "work_per_round": work_per_round(nodes, first, last, wanted),
        "cohorts": cohorts(nodes, first, last),
    }


# ---------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------
def fmt(x: float, unit: str = "s") -> str:
    if isinstance(x, float) and math.isnan(x):
        return "n/a"
    if x == float("inf"):
        return "never"
    return f"{x:.2f}{unit}" if unit == "s" else f"{x:.1%}"


def table(results: list[dict]) -> str:
    head = (
        "| nodes | batches | pairs delivered | arrival p50 | arrival p95 | arrival max | used-by p50 / p95 "
        "| every-peer p50 "
        "| every-peer p95 | all peers before next round | all peers before next batch | share of round "
        "| net share | round p50 "
        "| share p50 | net share p50 |"
    )
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in results:
        a = r["analysis"]
        lines.append(
            f"| {r['nodes']} | {a['batches']} | {a['pairs_delivered']}/{a['pairs_expected']} "
            f"| {fmt(a['arrival_p50_s'])} | {fmt(a['arrival_p95_s'])} | {fmt(a['arrival_max_s'])} "
            f"| {fmt(a['used_p50_s'])} / {fmt(a['used_p95_s'])} "
            f"| {fmt(a['every_peer_p50_s'])} | {fmt(a['every_peer_p95_s'])} "
            f"| {fmt(a['reached_all_before_next_round'], '%')} "
            f"| {fmt(a['reached_all_before_next_batch'], '%')} | {fmt(a['share_of_round'], '%')} "
            f"| {fmt(a['net_share_of_round'], '%')} | {fmt(a['round_p50_s'])} | {fmt(a['share_p50_s'])} "
            f"| {fmt(a['net_share_p50_s'])} |"
        )
    return "\n".join(lines)


def _parts(a: dict, prefix: str) -> str:
    return " | ".join(
        f"{fmt(a[prefix + 'breakdown_p50_s'][k])} / {fmt(a[prefix + 'breakdown_p95_s'][k])}"
        for k in BREAKDOWN
    )


def breakdown_table(results: list[dict]) -> str:
    head = (
        "| nodes | " + " | ".join(f"{k} p50 / p95" for k in BREAKDOWN)
        + " | DHT store p50 | found by notice | served by a holder |"
    )  # fmt: skip
    lines = [head, "|" + "|".join(["---"] * (len(BREAKDOWN) + 4)) + "|"]
    for r in results:
        a = r["analysis"]
        lines.append(
            f"| {r['nodes']} | {_parts(a, '')} | {fmt(a['publish_store_p50_s'])} "
            f"| {fmt(a['found_by_notice'], '%')} | {fmt(a['served_by_holder'], '%')} |"
        )
        if "used_breakdown_p95_s" in a:  # the pairs trained on (runs analysed before had no such split)
            notice = fmt(a["used_found_by_notice"], "%")
            lines.append(f"| {r['nodes']}, trained on | {_parts(a, 'used_')} | | {notice} | |")
    return "\n".join(lines)


def work_table(results: list[dict]) -> str:
    """Per node per round (mean over nodes; the busiest node's in brackets)."""
    names = ("notices_sent", "notices_received", "pulls", "verifications", "bytes_in", "bytes_out")
    head = (
        "| nodes | " + " | ".join(name.replace("_", " ") for name in names)
        + " | rounds filling J | short rounds ended by | cohorts in time / trained-on graph |"
    )  # fmt: skip
    lines = [head, "|" + "|".join(["---"] * (len(names) + 4)) + "|"]
    for r in results:
        w, c = r["analysis"]["work_per_round"], r["analysis"]["cohorts"]
        cells = [f"{w[name]:.1f} ({w[f'{name}_max_node']:.1f})" for name in names]
        ended_by = ", ".join(f"{why} {n}" for why, n in sorted(w["short_rounds_ended_by"].items())) or "-"
        lines.append(
            f"| {r['nodes']} | " + " | ".join(cells) + f" | {fmt(w['rounds_filling_j'], '%')} | {ended_by} "
            f"| {c['time_cohorts']} / {c['trained_components']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16], help="swarm sizes to run")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per node (including warm-up)")
    parser.add_argument("--warmup", type=int, default=1, help="first rounds left out of the statistics")
    parser.add_argument("--cooldown", type=int, default=1, help="last rounds left out (nodes leaving)")
    parser.add_argument("--deadline", type=float, default=10.0, help="swarm.share_deadline_s")
    parser.add_argument("--config", type=Path, default=REPO / "node_configs" / "tiny.yaml")
    parser.add_argument(
        "--view", type=int, default=None,
        help="swarm.view_size of every node (a view smaller than the swarm: the full view's regime)",
    )  # fmt: skip
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="longest swarm start-up (s)")
    parser.add_argument("--round-timeout", type=float, default=60.0, help="time allowed per round (s)")
    parser.add_argument("--workdir", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the run folders")
    parser.add_argument("--json", type=Path, default=None, help="also write all results as JSON here")
    args = parser.parse_args()
    if args.rounds <= args.warmup + args.cooldown:
        parser.error("--rounds must be larger than --warmup + --cooldown")
    first, last = args.warmup + 1, args.rounds - args.cooldown

    machine = machine_info("benchmarks.swarm_latency")
    print(f"machine: {describe_machine(machine)}", file=sys.stderr)
    for line in machine["other_swarmnode_processes"]:
        print(f"note: another swarmnode process competes for the CPU: {line}", file=sys.stderr)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="swarm-latency-"))
    results = []
    try:
        for n in args.nodes:
            if n < 2:
                parser.error("a swarm needs at least 2 nodes")
            print(f"running {n} nodes x {args.rounds} rounds in {workdir / f'n{n}'} ...", file=sys.stderr)
            dirs, info = run_swarm(n, args, workdir)
            analysis = analyse(dirs, first, last, load_config(args.config).swarm.peer_groups_per_round)
            results.append({"nodes": n, "run": info, "analysis": analysis})
            status = "TIMED OUT" if info["timed_out"] else "done"
            bad = sum(1 for c in info["exit_codes"] if c != 0)
            print(
                f"  {status} in {info['wall_s']}s, {bad} node(s) exited non-zero, "
                f"load {[round(x, 1) for x in info['load_after']]}",
                file=sys.stderr,
            )
            print(table(results[-1:]), file=sys.stderr)
            print(work_table(results[-1:]), file=sys.stderr)
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"\n{args.rounds} rounds per node, statistics over rounds {first}-{last}; "
        f"share_deadline_s={args.deadline}"
    )
    print(table(results))
    print("\nwhere the arrival time goes (per batch-receiver pair):")
    print(breakdown_table(results))
    print("\neach node's network work per round (mean over nodes; the busiest node's in brackets):")
    print(work_table(results))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                indent=1,
                default=str,
            )  # fmt: skip
        )
    return 0 if all(not r["run"]["timed_out"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
