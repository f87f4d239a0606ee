"""Simulate the public network (docs/scaling.md): per-node work, delivery latency, rounds that fill J and
bootstrap nodes, for swarms no machine here can run: the data plane as it was (today), as the code is
(bounded) and as the target design has it (target).

The model is ``benchmarks.simulation.engine`` (what is exact and what is approximated is said there),
priced by ``benchmarks.simulation.load`` with the per-operation costs of benchmarks/swarm_sim_costs.json
(each with its source: measured here by benchmarks/swarm_sim_measure.py, or a committed figure, or a
stated estimate). Two network profiles: ``internet`` (the public demo's config and batch, RTT and
bandwidth as stated below) and ``loopback`` (the tiny config on 127.0.0.1, as benchmarks.swarm_latency
runs it: for validation). Usage:

    .venv/bin/python -m benchmarks.swarm_sim --nodes 8 16 32 100 1000 10000 --variant today target
    .venv/bin/python -m benchmarks.swarm_sim --nodes 100 1000 10000 --variant target --hops 1 2 3 6
    .venv/bin/python -m benchmarks.swarm_sim --measure [--measure-net]      # re-measure, rewrite costs
    .venv/bin/python -m benchmarks.swarm_sim --nodes 8 16 32 100 1000 10000 --variant bounded
    .venv/bin/python -m benchmarks.swarm_sim --validate runs/latency.json --variant bounded

``--validate`` reads a ``benchmarks.swarm_latency --json`` report that carries the per-node counts
(``benchmarks.simulation.validation`` says which fields, and computes them from metrics.jsonl),
simulates each of its swarm sizes with the loopback profile and that run's round time, and prints
simulated / measured per field (the bar: within 25%).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.simulation.engine import Result, simulate
from benchmarks.simulation.load import Costs, bootstrap_load, per_node_costs
from benchmarks.simulation.scenario import Protocol, Scenario
from benchmarks.simulation.validation import FIELDS, TOLERANCE, compare, loopback_per_node

COSTS = Path(__file__).with_name("swarm_sim_costs.json")
SWARM_BENCHMARK = "docs/swarm-benchmark.md, run H (2026-11-23)"
STATED = {  # the costs no script here measures: committed figures and estimates, with their source
    "stream_overhead_bytes": (
        150,
        "bytes",
        "estimate: a libp2p stream on an open connection (multistream "
        "header and protocol id each way, yamux frame headers); not measured",
    ),
    "dht_key_request_bytes": (
        100,
        "bytes",
        "estimate: one key's share of a DHT find request and the answer's framing; not measured",
    ),
    "round_s_public": (
        62.0,
        "s",
        "docs/performance.md, idle re-measure 2026-11-23: SmolLM2 solo round 2, "
        "62 s (sample 51 s, train 11 s)",
    ),
    "sample_share_public": (51 / 62, "", "same round: 51 s of 62 s sampling"),
    "round_s_loopback_8": (3.52, "s", f"{SWARM_BENCHMARK}: round p50 at 8 nodes"),
    "round_s_loopback_16": (10.27, "s", f"{SWARM_BENCHMARK}: round p50 at 16 nodes"),
    "round_s_loopback_32": (12.22, "s", f"{SWARM_BENCHMARK}: round p50 at 32 nodes"),
    "rtt_internet_s": (0.08, "s", "assumption: a round trip between home nodes on one continent"),
    "bandwidth_internet_bytes_per_s": (2.5e6, "bytes/s", "assumption: 20 Mbit/s each way per node"),
}


# ---------------------------------------------------------------------------------------------------
# the cost table
# ---------------------------------------------------------------------------------------------------
def write_costs(path: Path, measure_net: bool) -> None:
    """Measure what is cheap, keep the rest (and earlier network measurements unless re-measured)."""
    from benchmarks import swarm_sim_measure

    old = json.loads(path.read_text())["costs"] if path.exists() else {}
    table = {k: {"value": v, "unit": u, "source": s} for k, (v, u, s) in STATED.items()}
    table |= {k: v for k, v in old.items() if k not in table}
    table |= swarm_sim_measure.measure()
    if measure_net:
        table |= swarm_sim_measure.measure_net()
    missing = [k for k in NET_COSTS if k not in table]
    if missing:
        raise SystemExit(f"{path} lacks {', '.join(missing)}: run with --measure-net once")
    path.write_text(
        json.dumps({"about": __doc__.split("\n\n")[0], "costs": dict(sorted(table.items()))}, indent=1) + "\n"
    )
    print(f"wrote {path} ({len(table)} costs)", file=sys.stderr)


NET_COSTS = (
    "notice_stream_cpu_s",
    "notice_local_s",
    "pull_stream_cpu_s",
    "fetch_local_s",
    "dht_key_cpu_s",
    "dht_key_server_cpu_s",
    "dht_get_local_s",
)


# ---------------------------------------------------------------------------------------------------
# scenarios
# ---------------------------------------------------------------------------------------------------
def scenario_for(
    nodes: int, args: argparse.Namespace, costs: Costs, round_s: float | None = None
) -> Scenario:
    """One swarm size on a profile: ``internet`` (public demo: SmolLM2 rounds, its batch, deadline 30 s)
    or ``loopback`` (tiny config, 127.0.0.1, deadline 10 s as benchmarks.swarm_latency sets it)."""
    common = dict(
        nodes=nodes,
        churn_per_min=args.churn,
        silent_share=args.silent,
        rounds=args.rounds,
        observers=args.observers,
        seed=args.seed,
        notice_local_s=costs["notice_local_s"],
        fetch_local_s=costs["fetch_local_s"],
        check_s=costs["announcement_check_s"],
        dht_get_local_s=costs["dht_get_local_s"],
    )
    if args.profile == "loopback":
        nearest = min((8, 16, 32), key=lambda n: abs(math.log(n / nodes)))
        return Scenario(
            **common,
            rtt_s=0.0,
            bandwidth_bytes_per_s=1e9,
            batch_bytes=int(costs["batch_bytes_tiny"]),
            verify_s=costs["verify_batch_s_tiny"],
            deadline_s=10.0,
            sample_share=0.6,
            round_s=round_s or costs[f"round_s_loopback_{nearest}"],
        )
    return Scenario(
        **common,
        rtt_s=costs["rtt_internet_s"],
        bandwidth_bytes_per_s=costs["bandwidth_internet_bytes_per_s"],
        batch_bytes=int(costs["batch_bytes_public"]),
        verify_s=costs["verify_batch_s_public"],
        deadline_s=30.0,
        round_s=round_s or costs["round_s_public"],
        sample_share=costs["sample_share_public"],
    )


def protocols(args: argparse.Namespace) -> list[Protocol]:
    out = []
    for variant in args.variant:
        if variant == "today":
            out.append(Protocol.today())
        elif variant == "bounded":
            bounded = replace(Protocol.bounded(), exploration_divisor=args.exploration_divisor)
            out.append(bounded if args.view is None else replace(bounded, view=args.view))
        else:
            for hops in args.hops:
                out.append(
                    Protocol.target(
                        fanout=args.fanout,
                        hops=hops,
                        k_factor=args.k_factor,
                        **({} if args.view is None else {"view": args.view}),
                    )  # fmt: skip
                )
    return out


def row(result: Result, costs: Costs, nat_share: float, wall_s: float) -> dict:
    """Everything about one simulated scenario, flat, for the table and the JSON."""
    p = result.protocol
    name = (
        p.name
        if not p.gossip
        else f"{p.name} V={p.view} D={p.fanout} H={p.hops} K={p.pulls_per_round(result.scenario.j)}"
    )
    return {
        "variant": name,
        "nodes": result.scenario.nodes,
        **result.per_node,
        **per_node_costs(result, costs, nat_share),
        **bootstrap_load(result, costs, nat_share),
        "fill_share": result.fill_share,
        "use_latency_p50_s": result.use_latency_p50_s,
        "use_latency_p95_s": result.use_latency_p95_s,
        "arrival_p95_s": result.arrival_p95_s,
        "reach_mean": result.reach_mean,
        "observer_rounds": result.observer_rounds,
        "exact_gossip_share": result.exact_gossip_share,
        "events": result.events,
        "sim_wall_s": wall_s,
    }


def run_one(scenario: Scenario, protocol: Protocol) -> tuple[Result, float]:
    start = time.monotonic()
    result = simulate(scenario, protocol)
    return result, time.monotonic() - start


def fmt(x: float, digits: int = 1) -> str:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return "n/a" if math.isnan(x) else "inf"
    return f"{x:,.{digits}f}"


def table(rows: list[dict]) -> str:
    head = (
        "| variant | nodes | notices sent / received | pulls | verifications | payload KB in / out "
        "| all KB in+out | CPU s | use latency p50 / p95 | rounds filling J | bootstraps (DHT / relay) "
        "| sim s |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['nodes']:,} | {fmt(r['notices_sent'])} / {fmt(r['notices_received'])} "
            f"| {fmt(r.get('pulls', 0.0))} | {fmt(r.get('verifications', 0.0))} "
            f"| {fmt(r['payload_bytes_in'] / 1e3, 0)} / {fmt(r['payload_bytes_out'] / 1e3, 0)} "
            f"| {fmt(r['bytes_total'] / 1e3, 0)} | {fmt(r['cpu_total_s'], 2)} "
            f"| {fmt(r['use_latency_p50_s'], 2)} / {fmt(r['use_latency_p95_s'], 2)} s "
            f"| {fmt(100 * r['fill_share'])}% | {r['bootstraps']} ({fmt(r['bootstraps_for_dht'], 0)} / "
            f"{r['bootstraps_for_relays']}) | {fmt(r['sim_wall_s'])} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# validation against loopback runs
# ---------------------------------------------------------------------------------------------------
def validate(path: Path, args: argparse.Namespace, costs: Costs) -> bool:
    """Simulate each swarm size of a loopback report with its round time; print simulated / measured."""
    report = json.loads(path.read_text())
    measured = loopback_per_node(report)
    if not measured:
        print(f"{path}: no result has analysis.per_node_per_round with {', '.join(FIELDS)}", file=sys.stderr)
        return False
    loopback = argparse.Namespace(  # steady state: --rounds (12), not the short run's 5
        **{
            **vars(args),
            "profile": "loopback",
            "churn": 0.0,
            "silent": 0.0,
            "observers": max(measured),
        }
    )
    ok = True
    print(
        "| variant | nodes | field | simulated | measured | simulated / measured |\n|---|---|---|---|---|---|"
    )
    for protocol in protocols(args):
        for nodes, real in sorted(measured.items()):
            result, _ = run_one(scenario_for(nodes, loopback, costs, real["round_s"]), protocol)
            simulated = result.per_node | {"bytes_out": result.per_node.get("bytes_in", 0.0)}
            wanted = dict(real["per_node"])
            if real["fill_share"] is not None:
                simulated["fill_share"], wanted["fill_share"] = result.fill_share, float(real["fill_share"])
            for name, sim, meas, within in compare(simulated, wanted):
                ok &= within
                ratio = fmt(sim / meas, 2) if meas else "n/a"
                print(f"| {protocol.name} | {nodes} | {name} | {fmt(sim, 2)} | {fmt(meas, 2)} | {ratio} |")
    print(f"\nwithin {TOLERANCE:.0%} everywhere: {'yes' if ok else 'no'}")
    return ok


def plot(rows: list[dict], path: Path) -> None:
    """Per-node notices, bytes and CPU seconds a round against the swarm's size, a line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("notices_sent", "notices sent", 1),
        ("bytes_total", "KB in + out", 1e3),
        ("cpu_total_s", "CPU s", 1),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.8))
    for ax, (key, label, unit) in zip(axes, panels, strict=True):
        for variant in dict.fromkeys(r["variant"] for r in rows):
            mine = [r for r in rows if r["variant"] == variant]
            ax.plot([r["nodes"] for r in mine], [r[key] / unit for r in mine], marker="o", label=variant)
        ax.set(xscale="log", yscale="log", xlabel="nodes", title=f"{label} per node and round")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 32, 100, 1000, 10000])
    parser.add_argument(
        "--variant", nargs="+", choices=("today", "bounded", "target"), default=["today", "bounded", "target"]
    )
    parser.add_argument("--profile", choices=("internet", "loopback"), default="internet")
    parser.add_argument(
        "--churn", type=float, default=0.02, help="share of nodes leaving (and joining) a minute"
    )
    parser.add_argument("--silent", type=float, default=0.1, help="share of silent Sybil nodes")
    parser.add_argument(
        "--nat", type=float, default=0.5, help="share of nodes behind NAT (relayed by bootstraps)"
    )
    parser.add_argument(
        "--view", type=int, default=None,
        help="V, the view: target's (default 32); bounded's swarm.view_size (default the code's, 128)",
    )  # fmt: skip
    parser.add_argument("--fanout", type=int, default=6, help="target: D, peers a notice is sent to")
    parser.add_argument("--hops", type=int, nargs="+", default=[2], help="target: H, hop limit(s)")
    parser.add_argument("--k-factor", type=float, default=3.0, help="target: K = this x J pulls a round")
    parser.add_argument(
        "--exploration-divisor", type=int, default=1,
        help="bounded: first pulls of authors without standing a round, K // this (1: the code; 0: none)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=12, help="simulated rounds (2 of them warm-up)")
    parser.add_argument("--observers", type=int, default=48, help="nodes simulated event by event")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--costs", type=Path, default=COSTS)
    parser.add_argument("--measure", action="store_true", help="re-measure the cheap costs, rewrite --costs")
    parser.add_argument("--measure-net", action="store_true", help="with --measure: also streams and DHT")
    parser.add_argument("--validate", type=Path, help="a benchmarks.swarm_latency --json report to compare")
    parser.add_argument("--json", type=Path, default=Path("runs/swarm_sim.json"), help="write all rows here")
    parser.add_argument("--plot", type=Path, help="also draw the rows as a PNG here (matplotlib)")
    args = parser.parse_args()

    if args.measure:
        write_costs(args.costs, args.measure_net)
    costs = Costs.load(args.costs)
    if args.validate:
        return 0 if validate(args.validate, args, costs) else 1
    rows = []
    for protocol in protocols(args):
        for nodes in args.nodes:
            scenario = scenario_for(nodes, args, costs)
            result, wall = run_one(scenario, protocol)
            rows.append(row(result, costs, args.nat, wall) | {"scenario": asdict(scenario)})
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(
        f"\nprofile {args.profile}, churn {args.churn:.0%}/min, silent {args.silent:.0%}, behind NAT "
        f"{args.nat:.0%}; per node and round\n"
    )
    print(table(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1, default=str)
    )
    print(f"\nwrote {args.json}", file=sys.stderr)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
