"""What sharing buys: SAPO's local/peer table, and off-policy corrections, with real nodes.

Every arm runs the same ``--nodes`` identities (so the same question stream per node) on the same config
and seeds, as real ``swarmnode`` processes on 127.0.0.1, one torch thread each:

table 1, sharing (SAPO, arXiv 2509.08721, Table 1; each node trains on ``--groups`` question groups a round):
  silo      every node alone (``swarmnode solo``), all groups local
  L/E       a swarm (``swarmnode join``): L local groups + E verified peer groups per round,
            for every split L/E in ``--splits`` (e.g. 3/1 2/2 1/3)
table 2, off-policy corrections:
  foreign-none / foreign-luffy
            the 2/2-style swarm whose peers withhold their log-probs (``swarm.share_logprobs=false``),
            so every peer completion is foreign text to the learner: ``offpolicy.foreign`` none vs luffy
  stale-none / stale-remix
            silo nodes that also replay their own older groups (``replay.groups_per_round``, from up to
            ``replay.max_staleness`` policy versions back) with two updates per round:
            ``offpolicy.local`` none vs remix

Reward per round is the node's mean reward over its *own* freshly sampled completions (task score +
format bonus, as trained); "cumulative reward" sums it over rounds, as SAPO does, averaged over the
arm's nodes (so arms run with different ``--nodes`` compare). The script
writes a markdown report (the tables, relative to silo, plus diagnostics) and a PNG of the moving
average reward per round. Arms already complete in ``--workdir`` are reused, so the report can be
rebuilt (``--report-only``) or arms added later. Every wait is bounded; only processes this script
started are ended, by PID. Each node's final checkpoint (1.6 GB) is deleted once its arm is done
unless ``--keep-checkpoints``.

    .venv/bin/python -m benchmarks.sapo_table --rounds 20                 # both tables
    .venv/bin/python -m benchmarks.sapo_table --rounds 20 --offpolicy-nodes 2   # table 2 on 2 nodes
    .venv/bin/python -m benchmarks.sapo_table --arms silo 2/2 --rounds 4  # a quick subset
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import drop_checkpoints
from tests.helpers.machine import describe_machine, machine_info
from tests.helpers.swarm_procs import NodeProc, read_jsonl, record_exit, start_node, stop_all, wait_all

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Arm:
    name: str
    table: str  # "sharing" or "offpolicy"
    local: int  # question groups sampled per node and round
    peer: int  # peer groups trained on per round (0: a silo node, run with `swarmnode solo`)
    sets: tuple[str, ...] = field(default=())  # extra config overrides
    what: str = ""

    @property
    def swarm(self) -> bool:
        return self.peer > 0

    @property
    def slug(self) -> str:
        return self.name.replace("/", "-")


def build_arms(groups: int, splits: list[str], replay_groups: int) -> list[Arm]:
    arms = [Arm("silo", "sharing", groups, 0, what=f"{groups} local groups, no sharing")]
    for split in splits:
        local, peer = (int(x) for x in split.split("/"))
        if local + peer != groups or peer <= 0 or local <= 0:
            raise SystemExit(f"--splits {split}: need L/E with L, E > 0 and L + E = --groups ({groups})")
        arms.append(Arm(split, "sharing", local, peer, what=f"{local} local + {peer} peer groups"))
    half = groups // 2
    withheld = ("swarm.share_logprobs=false",)
    for mode in ("none", "luffy"):
        arms.append(
            Arm(
                f"foreign-{mode}", "offpolicy", groups - half, half, (*withheld, f"offpolicy.foreign={mode}"),
                what=f"{groups - half}/{half}, peers' log-probs withheld, foreign correction {mode}",
            )
        )  # fmt: skip
    replay = (f"replay.groups_per_round={replay_groups}", "train.updates_per_round=2")
    for mode in ("none", "remix"):
        arms.append(
            Arm(
                f"stale-{mode}", "offpolicy", groups, 0, (*replay, f"offpolicy.local={mode}"),
                what=f"silo + {replay_groups} replayed own groups, 2 updates/round, local correction {mode}",
            )
        )  # fmt: skip
    return arms


# ---------------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------------
def make_keys(workdir: Path, nodes: int) -> list[Path]:
    """One identity per node, shared by every arm: a node's question stream is seeded by its peer id."""
    keys = [workdir / "keys" / f"node{i}.key" for i in range(nodes)]
    keys[0].parent.mkdir(parents=True, exist_ok=True)
    for key in keys:
        if not key.exists():
            subprocess.run(
                [sys.executable, "-m", "swarmnode.cli", "keygen", "--out", str(key)],
                check=True, cwd=REPO, capture_output=True,
            )  # fmt: skip
    return keys


def arm_nodes(arm: Arm, args: argparse.Namespace) -> int:
    """``--nodes``, or ``--offpolicy-nodes`` for table 2 (each SmolLM2 node needs ~4.5 GB of RAM)."""
    return args.nodes if arm.table == "sharing" else args.offpolicy_nodes or args.nodes


def node_args(arm: Arm, args: argparse.Namespace, key: Path, swarm_id: str) -> list[str]:
    sets = [
        f"run.identity_path={key}",
        "run.cpu_threads=1",
        "run.metrics_port=null",
        "run.resume=false",
        "run.checkpoint_every=100000",  # only the final checkpoint
        f"sampling.questions_per_round={arm.local}",
        f"train.seed={args.seed}",
        *arm.sets,
        *args.set,
    ]
    if arm.swarm:
        sets += [
            f"swarm.peer_groups_per_round={arm.peer}",
            f"swarm.swarm_id={swarm_id}",
            f"swarm.min_peers={arm_nodes(arm, args) - 1}",
            f"swarm.wait_for_peers_s={args.startup_timeout}",
            f"swarm.share_deadline_s={args.deadline}",
        ]
    out = ["--config", str(args.config), "--rounds", str(args.rounds)]
    for s in sets:
        out += ["--set", s]
    return out


def script_command() -> str:
    return "python -m benchmarks.sapo_table " + shlex.join(sys.argv[1:])


def arm_complete(arm_dir: Path, nodes: int, rounds: int) -> bool:
    return (arm_dir / "arm.json").exists() and all(
        len(read_jsonl(arm_dir / f"node{i}" / "metrics.jsonl")) >= rounds for i in range(nodes)
    )


def run_arm(arm: Arm, args: argparse.Namespace, keys: list[Path]) -> dict:
    """All nodes of one arm to completion (or the time limit); writes and returns ``arm.json``."""
    arm_dir = args.workdir / arm.slug
    if arm_dir.exists():
        shutil.rmtree(arm_dir)
    arm_dir.mkdir(parents=True)
    swarm_id = f"sapo-{arm.slug}-{os.getpid()}"
    command = "join" if arm.swarm else "solo"
    nodes: list[NodeProc] = []
    info = {
        "arm": arm.name, "command": command, "nodes": arm_nodes(arm, args), "rounds": args.rounds,
        "timed_out": False, "load_before": os.getloadavg(), "script": script_command(),
    }  # fmt: skip
    t0 = time.monotonic()
    try:
        first = start_node(arm_dir / "node0", *node_args(arm, args, keys[0], swarm_id), command=command)
        nodes.append(first)
        peers = [first.address(timeout_s=args.startup_timeout)] if arm.swarm else []
        for i in range(1, arm_nodes(arm, args)):
            argv = node_args(arm, args, keys[i], swarm_id)
            nodes.append(start_node(arm_dir / f"node{i}", *argv, peers=peers, command=command))
        info["timed_out"] = wait_all(nodes, t0 + args.startup_timeout + args.rounds * args.round_timeout)
    finally:
        stop_all(nodes)
    record_exit(info, nodes, t0)
    info["node_args_0"] = shlex.join(["swarmnode", command, *node_args(arm, args, keys[0], swarm_id)])
    for i, node in enumerate(nodes):
        if node.proc.returncode != 0:
            print(
                f"--- {arm.name} node{i} exited {node.proc.returncode}:\n{node.output()[-3000:]}",
                file=sys.stderr,
            )
    (arm_dir / "arm.json").write_text(json.dumps(info, indent=1, default=str))
    if not args.keep_checkpoints:
        drop_checkpoints([node.run_dir for node in nodes])
    return info


# ---------------------------------------------------------------------------------------------------
# analysis
# ---------------------------------------------------------------------------------------------------
def arm_records(arm_dir: Path, info: dict) -> list[list[dict]]:
    """Per node of the arm, its round records (the arm's own node and round counts: arms added later
    with other ``--nodes``/``--rounds`` report as they ran)."""
    return [
        read_jsonl(arm_dir / f"node{i}" / "metrics.jsonl")[: info["rounds"]] for i in range(info["nodes"])
    ]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarize(arm: Arm, per_node: list[list[dict]]) -> dict:
    rows = [r for node in per_node for r in node]
    rounds = min((len(node) for node in per_node), default=0)
    per_round = [_mean([node[k]["reward_mean"] for node in per_node]) for k in range(rounds)]
    local_groups = sum(r["groups_local"] for r in rows)
    local_kept = sum(r["groups_kept"] - r["groups_peer"] - r["groups_replayed"] for r in rows)
    tail = [r for node in per_node for r in node[-5:]]
    per_node_sums = [sum(r["reward_mean"] for r in node) for node in per_node]
    return {
        "rounds": rounds,
        "cumulative_reward_se": statistics.stdev(per_node_sums) / len(per_node) ** 0.5
        if len(per_node) > 1
        else float("nan"),
        "cumulative_reward": sum(r["reward_mean"] for r in rows) / len(per_node),
        "cumulative_task_score": sum(r["task_score_mean"] for r in rows) / len(per_node),
        "reward_per_round": per_round,
        "format_last5": _mean([r["format_rate"] for r in tail]),
        "task_score_last5": _mean([r["task_score_mean"] for r in tail]),
        "informative_local": local_kept / local_groups if local_groups else float("nan"),
        "peer_groups_per_round": _mean([r["groups_peer"] for r in rows]),
        "peer_reward": _mean([r["reward_peer_mean"] for r in rows if r["groups_peer"]]),
        "replayed_per_round": _mean([r["groups_replayed"] for r in rows]),
        "is_weight_max": max((r["train_is_weight_max"] for r in rows), default=float("nan")),
        "ess": _mean([r["train_ess"] for r in rows if r["train_tokens"]]),
        "clip_frac": _mean(
            [r["train_clip_low_frac"] + r["train_clip_high_frac"] for r in rows if r["train_tokens"]]
        ),
        "seconds_per_round": _mean([r["seconds_total"] for r in rows]),
    }


def moving_average(values: list[float], window: int) -> list[float]:
    out = []
    for k in range(len(values)):
        chunk = values[max(0, k - window + 1) : k + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def plot(arms: list[Arm], results: dict[str, dict], path: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = [t for t in ("sharing", "offpolicy") if any(a.table == t and a.name in results for a in arms)]
    fig, axes = plt.subplots(1, len(tables), figsize=(6.5 * len(tables), 4.2), squeeze=False)
    for ax, table in zip(axes[0], tables, strict=True):
        shown = [a for a in arms if (a.table == table or a.name == "silo") and a.name in results]
        for arm in shown:
            series = results[arm.name]["reward_per_round"]
            ax.plot(range(1, len(series) + 1), moving_average(series, window), label=arm.name)
        ax.set_title("sharing: local/peer groups" if table == "sharing" else "off-policy corrections")
        ax.set_xlabel("round")
        ax.set_ylabel(f"reward, mean over nodes, moving average of {window}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def fmt(x: float, spec: str = ".3f") -> str:
    return "n/a" if x != x else format(x, spec)


def report(arms: list[Arm], results: dict[str, dict], infos: dict[str, dict], args, machine: dict) -> str:
    silo = results.get("silo", {}).get("silo_by_nodes", {})
    commands = sorted({i["script"] for i in infos.values()})
    lines = [
        "# What sharing buys: SAPO's local/peer table reproduced, and off-policy corrections",
        "",
        "Command(s): " + ", ".join(f"`{c}`" for c in commands) + "  ",
        f"Config: `{args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config}`"
        + (f" with `{' '.join(args.set)}`" if args.set else "")
        + f", {args.groups} question groups per node and round, train.seed={args.seed}  ",
        f"Machine: {describe_machine(machine, now=False)}, shared with other work during the runs (load "
        "before and after each arm in its `arm.json`)  ",
        f"Wall time: {sum(i['wall_s'] for i in infos.values()) / 60:.0f} min for the arms in this report "
        "(per arm below)",
        "",
    ]
    cols = (
        "| arm | what | nodes x rounds | cumulative reward | vs silo | cumulative task score | "
        "task score, last 5 | format, last 5 | informative local groups | peer groups/round | "
        "replayed groups/round | peer group reward | max IS weight | ESS | clip frac | s/round | wall |"
    )
    for table, title in (("sharing", "Table 1: sharing"), ("offpolicy", "Table 2: off-policy corrections")):
        shown = [a for a in arms if a.table == table and a.name in results]
        if table == "offpolicy" and "silo" in results:
            shown = [a for a in arms if a.name == "silo"] + shown
        if not [a for a in shown if a.table == table]:
            continue
        lines += [f"## {title}", "", cols, cols_rule(cols)]
        for arm in shown:
            r, info = results[arm.name], infos[arm.name]
            base = silo.get(info["nodes"])  # the silo run of the same node identities (same questions)
            rel = f"{(r['cumulative_reward'] / base - 1) * 100:+.0f}%" if base else "n/a"
            lines.append(
                f"| {arm.name} | {arm.what} | {info['nodes']} x {info['rounds']} | "
                f"{r['cumulative_reward']:.2f} ± {fmt(r['cumulative_reward_se'], '.2f')} | {rel} | "
                f"{r['cumulative_task_score']:.2f} | {fmt(r['task_score_last5'])} | "
                f"{fmt(r['format_last5'], '.0%')} | "
                f"{fmt(r['informative_local'], '.0%')} | {fmt(r['peer_groups_per_round'], '.2f')} | "
                f"{fmt(r['replayed_per_round'], '.2f')} | "
                f"{fmt(r['peer_reward'])} | {fmt(r['is_weight_max'], '.2f')} | {fmt(r['ess'])} | "
                f"{fmt(r['clip_frac'])} | {r['seconds_per_round']:.0f} | {info['wall_s'] / 60:.0f} min"
                + (" (TIMED OUT)" if info.get("timed_out") else "")
                + (f" (exit codes {info['exit_codes']})" if any(info.get("exit_codes", [])) else "")
                + " |"
            )
        lines.append("")
    notes = [f"- {name}: {info['note']}" for name, info in infos.items() if info.get("note")]
    if notes:
        lines += ["Notes on the runs:", "", *notes, ""]
    lines += [
        f"![moving-average reward per round]({args.plot.name})",
        "",
        f"All arms are compared over the first {min(r['rounds'] for r in results.values())} rounds; "
        "an arm run with fewer nodes is compared with the silo run of the same node identities. "
        "Columns: cumulative reward = sum over rounds of the mean reward of the node's own fresh "
        "completions, averaged over nodes (task score + format bonus), ± its standard error over "
        "nodes; task score excludes the format bonus; informative local groups = share of own groups "
        "whose rewards were not all equal (the others have zero advantage and are dropped); peer group "
        "reward = mean reward of the peer groups trained on (re-scored by the receiver); max IS weight, "
        "ESS and clip frac are the trainer's off-policy diagnostics.",
        "",
    ]
    return "\n".join(lines)


def cols_rule(header: str) -> str:
    return "|" + "---|" * (header.count("|") - 1)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=REPO / "node_configs" / "arithmetic-easy.yaml")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument(
        "--offpolicy-nodes", type=int, default=None, help="nodes in the table 2 arms (default: --nodes)"
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--groups", type=int, default=4, help="question groups each node trains on per round")
    parser.add_argument("--splits", nargs="+", default=["3/1", "2/2", "1/3"], help="local/peer splits")
    parser.add_argument(
        "--replay-groups", type=int, default=2, help="replayed own groups per round (table 2)"
    )
    parser.add_argument("--arms", nargs="+", default=None, help="run only these arms (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="train.seed of every node")
    parser.add_argument("--set", action="append", default=[], help="extra config override for every node")
    parser.add_argument("--deadline", type=float, default=600.0, help="swarm.share_deadline_s (lockstep)")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--round-timeout", type=float, default=600.0, help="time allowed per round (s)")
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "sapo")
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "sapo.md")
    parser.add_argument("--plot", type=Path, default=None, help="PNG (default: next to the report)")
    parser.add_argument("--window", type=int, default=5, help="moving-average window of the plot")
    parser.add_argument("--fresh", action="store_true", help="re-run arms already complete in --workdir")
    parser.add_argument(
        "--keep-checkpoints", action="store_true", help="keep each node's final checkpoint (1.6 GB each)"
    )
    parser.add_argument("--report-only", action="store_true", help="only rebuild the report")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through run_arm's stop_all
    # a script started in the background by a shell inherits SIGINT ignored, and so would its nodes, which
    # stop_all ends with SIGINT: restore Python's handler (the nodes then get the default after exec)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args.plot = args.plot or args.report.with_suffix(".png")
    args.config = args.config.resolve()
    arms = build_arms(args.groups, args.splits, args.replay_groups)
    if args.arms:
        unknown = set(args.arms) - {a.name for a in arms}
        if unknown:
            parser.error(f"unknown arm(s) {sorted(unknown)}; choose from {[a.name for a in arms]}")
    selected = [a for a in arms if args.arms is None or a.name in args.arms]
    args.workdir.mkdir(parents=True, exist_ok=True)

    machine = machine_info("benchmarks.sapo_table")
    print(f"machine: {describe_machine(machine)}", file=sys.stderr)
    rivals = machine["other_swarmnode_processes"]
    if rivals:
        print(
            f"note: {len(rivals)} other swarmnode processes compete for the CPU, e.g. {rivals[0]}",
            file=sys.stderr,
        )
    keys = make_keys(args.workdir, max(args.nodes, args.offpolicy_nodes or 0))
    if not args.report_only:
        for arm in selected:
            if not args.fresh and arm_complete(args.workdir / arm.slug, arm_nodes(arm, args), args.rounds):
                print(f"{arm.name}: complete in {args.workdir / arm.slug}, reused", file=sys.stderr)
                continue
            print(
                f"{arm.name}: {arm.what}, {arm_nodes(arm, args)} nodes x {args.rounds} rounds ...",
                file=sys.stderr,
            )
            info = run_arm(arm, args, keys)
            print(
                f"{arm.name}: {'TIMED OUT' if info['timed_out'] else 'done'} in {info['wall_s']:.0f} s",
                file=sys.stderr,
            )

    records, infos = {}, {}
    for arm in arms:
        info_path = args.workdir / arm.slug / "arm.json"
        if not info_path.exists():
            continue
        info = json.loads(info_path.read_text())
        per_node = arm_records(args.workdir / arm.slug, info)
        if all(per_node):  # every node ran at least one round (an arm cut short is compared as far as it got)
            records[arm.name], infos[arm.name] = per_node, info
    if not records:
        print("no arm to report", file=sys.stderr)
        return 1
    common = min(len(node) for per_node in records.values() for node in per_node)
    print(f"comparing every arm over its first {common} rounds", file=sys.stderr)
    results = {
        arm.name: summarize(arm, [node[:common] for node in records[arm.name]])
        for arm in arms
        if arm.name in records
    }
    if "silo" in results:  # arms run with fewer --nodes compare with the silo run of those same nodes
        silo_nodes = [node[:common] for node in records["silo"]]
        results["silo"]["silo_by_nodes"] = {
            info["nodes"]: sum(r["reward_mean"] for node in silo_nodes[: info["nodes"]] for r in node)
            / info["nodes"]
            for info in infos.values()
            if info["nodes"] <= len(silo_nodes)
        }
    plot(arms, results, args.plot, args.window)
    args.report.write_text(report(arms, results, infos, args, machine))
    print(f"report: {args.report}\nplot: {args.plot}", file=sys.stderr)
    return 0 if all(not infos[a]["timed_out"] for a in infos) else 1


if __name__ == "__main__":
    sys.exit(main())
