"""What sharing buys: SAPO's local/peer table, off-policy corrections and specialists, over seeds, with
real nodes.

Every arm (``benchmarks/sharing/arms.py``: silo, silo-L, L/E splits, the off-policy arms and, with
``--specialise A B``, spec-silo, spec-L/E and generalist-silo) runs ``--nodes`` real ``swarmnode`` processes
on 127.0.0.1, one torch thread each, on the same config; seed s gives node i the question stream
``tasks.seed = 1000 s + i`` and ``train.seed = s`` in every arm, so arms compare paired by seed. Question
draws are common: node i's question j of round r is the same whichever number it samples a round,
so silo-4's first two questions of a round are silo-2's and 2/2's. (Summaries made before that drew
index ``round * count + j``: a silo node and a 2/2 node of one seed answered different questions.)

Reward per round is the node's mean reward over its *own* freshly sampled completions (task score +
format bonus, as trained); "cumulative reward" sums it over rounds, as SAPO does, averaged over the
arm's nodes. Every node also runs the fixed probe (``probe.every_rounds``, ``--probe-every``): the same
held-out questions, greedy, every k rounds, in every arm; its ``probe.jsonl`` lines go into the summary.

Each (arm, seed) runs on its own in ``--workdir/<arm>/seed-<s>/`` and, once every node has done its
rounds, its final checkpoints are scored on ``--eval-per-task`` held-out questions per task (``swarmnode
eval``'s code) and a small summary is written to ``--summaries/<arm>-seed<s>.json``
(``benchmarks/sharing/sapo_report.py``); then the checkpoints (1.6 GB each) are deleted unless
``--keep-checkpoints``. Parts started side by side evaluate one at a time (``runs/evaluation.lock``): two
evaluations at once only contend for the cores. An (arm, seed) whose summary exists is skipped unless
``--fresh``, so the experiment runs in parts, days apart. ``--report-only`` builds the SAPO table from
the summaries alone (the sharing experiments' report is ``benchmarks.sharing_report``). Every wait is
bounded; only processes this script started are ended, by PID.

    .venv/bin/python -m benchmarks.sapo_table --arms silo --seeds 0 --rounds 40   # one part
    .venv/bin/python -m benchmarks.sapo_table --arms silo-4 silo-2 2/2 --seeds 0 1 2 --rounds 40
    .venv/bin/python -m benchmarks.sapo_table --specialise basic_arithmetic propositional_logic \\
        --arms spec-silo spec-2/2 --seeds 0 --rounds 40 --summaries docs/sharing/e1
    .venv/bin/python -m benchmarks.sapo_table --report-only    # docs/sapo-table.md from docs/sapo/
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

from benchmarks.common import behind_other_sessions, drop_checkpoints, one_at_a_time, record_exit, wait_all
from benchmarks.harness.processes import NodeProc, read_jsonl, start_node, stop_all
from benchmarks.machine import describe_machine, machine_info
from benchmarks.sharing.arms import Arm, TaskSplit, build_arms, parse_split, select_arms, stream_seed
from benchmarks.sharing.sapo_report import (
    ROUND_FIELDS,
    dump,
    load_summaries,
    pending,
    plot,
    report,
    summary_path,
    write_report,
)

REPO = Path(__file__).resolve().parents[1]
# Parts launched side by side on one machine evaluate one after another (benchmarks.common.one_at_a_time),
# behind any part that trains (benchmarks.common.behind_other_sessions);
# one evaluation takes 10-25 min on 2 cores (Xeon, EPYC), so the wait is bounded at a few of them.
EVALUATION_LOCK = REPO / "runs" / "evaluation.lock"
EVALUATION_WAIT_S = 2 * 3600


def arm_nodes(arm: Arm, args: argparse.Namespace) -> int:
    """``--nodes``, or ``--offpolicy-nodes`` for table 2 (a SmolLM2 node peaks under 3 GB of RAM)."""
    return args.offpolicy_nodes or args.nodes if arm.table == "offpolicy" else args.nodes


def node_args(arm: Arm, seed: int, node: int, args: argparse.Namespace, swarm_id: str) -> list[str]:
    sets = [
        "run.cpu_threads=1",
        "run.metrics_port=null",
        "run.resume=false",
        "run.checkpoint_every=100000",  # only the final checkpoint
        f"sampling.questions_per_round={arm.local}",
        f"tasks.seed={stream_seed(seed, node)}",
        f"train.seed={seed}",
        *probe_sets(args),
        *arm.node_sets(node, arm_nodes(arm, args)),
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


def probe_sets(args: argparse.Namespace) -> list[str]:
    """The fixed probe, the same in every arm; none with ``--probe-every 0`` (the node's default: off),
    and the node's default question count unless ``--probe-questions`` is given."""
    if not args.probe_every:
        return []
    questions = [] if args.probe_questions is None else [f"probe.questions_per_task={args.probe_questions}"]
    return [f"probe.every_rounds={args.probe_every}", *questions]


def script_command() -> str:
    return "python -m benchmarks.sapo_table " + shlex.join(sys.argv[1:])


def node_dirs(arm: Arm, seed: int, args: argparse.Namespace) -> list[Path]:
    """The run folders of one (arm, seed), one per node."""
    return [args.workdir / arm.slug / f"seed-{seed}" / f"node{i}" for i in range(arm_nodes(arm, args))]


def rounds_per_node(run_dirs: list[Path]) -> list[int]:
    """Rounds each node has recorded so far (its metrics.jsonl lines)."""
    return [len(read_jsonl(d / "metrics.jsonl")) for d in run_dirs]


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's children that have ended and been waited for: the nodes
    of the parts run so far, with the children each of them waited for (its DHT process)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_part(arm: Arm, seed: int, args: argparse.Namespace, run_dirs: list[Path]) -> dict:
    """All nodes of one (arm, seed) to completion (or the time limit), in fresh ``run_dirs``."""
    part_dir = run_dirs[0].parent
    if part_dir.exists():
        shutil.rmtree(part_dir)
    part_dir.mkdir(parents=True)
    swarm_id = f"sapo-{arm.slug}-seed{seed}-{os.getpid()}"
    command = "join" if arm.swarm else "solo"
    nodes: list[NodeProc] = []
    info = {"timed_out": False, "load_before": os.getloadavg()}
    t0, cpu0 = time.monotonic(), children_cpu_s()
    try:
        first = start_node(run_dirs[0], *node_args(arm, seed, 0, args, swarm_id), command=command)
        nodes.append(first)
        peers = [first.address(timeout_s=args.startup_timeout)] if arm.swarm else []
        for i, run_dir in enumerate(run_dirs[1:], start=1):
            argv = node_args(arm, seed, i, args, swarm_id)
            nodes.append(start_node(run_dir, *argv, peers=peers, command=command))

        def progress() -> str:
            rounds, minutes = rounds_per_node(run_dirs), (time.monotonic() - t0) / 60
            return f"{arm.name} seed {seed}: rounds per node {rounds} of {args.rounds}, {minutes:.0f} min"

        limit = t0 + args.startup_timeout + args.rounds * args.round_timeout
        info["timed_out"] = wait_all(nodes, limit, progress)
    finally:
        stop_all(nodes)
    record_exit(info, nodes, t0)
    info["nodes_cpu_s"] = round(children_cpu_s() - cpu0, 1)  # what compute.cpu_per_node_round reads
    info["node_command"] = shlex.join(["swarmnode", command, *node_args(arm, seed, 0, args, swarm_id)])
    for i, node in enumerate(nodes):
        if node.proc.returncode != 0:
            print(
                f"--- {arm.name} seed {seed} node{i} exited {node.proc.returncode}:\n{node.output()[-3000:]}",
                file=sys.stderr,
            )
    return info


def evaluate_node(cfg, run_dir: Path, per_task: int) -> dict | None:
    """``swarmnode eval`` of the node's final checkpoint on ``per_task`` held-out questions of every task
    of its mix, those it never samples included (None when the node left no checkpoint)."""
    from swarmnode.checkpoint import choose
    from swarmnode.evaluate import evaluate_checkpoint

    checkpoint = choose(run_dir)
    if checkpoint is None:
        return None
    by_task = evaluate_checkpoint(cfg, checkpoint.path, per_task)
    return {
        "round": checkpoint.round,
        "questions": per_task * len(by_task),
        "pass@1": sum(row["pass@1"] for row in by_task.values()) / len(by_task),
        "score": sum(row["score"] for row in by_task.values()) / len(by_task),
        "by_task": by_task,
    }


def summarize_node(i: int, seed: int, run_dir: Path, args: argparse.Namespace) -> dict:
    """One node's record: its task weights (from its run folder's config), its rounds, its probe curve
    (``probe.jsonl`` as written) and the held-out score of its final checkpoint (evaluated here)."""
    from swarmnode.run_folder import config_for_run

    cfg = config_for_run(None, {"run.run_dir": str(run_dir)}, restart=False)
    records = read_jsonl(run_dir / "metrics.jsonl")[: args.rounds]
    return {
        "node": i,
        "tasks_seed": stream_seed(seed, i),
        "weights": {name: spec.weight for name, spec in cfg.tasks.mix.items()},
        "rounds": {name: [r.get(name) for r in records] for name in ROUND_FIELDS},
        "probe": read_jsonl(run_dir / "probe.jsonl"),
        "eval": evaluate_node(cfg, run_dir, args.eval_per_task),
    }


def summarize(arm: Arm, seed: int, args: argparse.Namespace, info: dict, run_dirs: list[Path]) -> dict:
    """The committed record of one finished (arm, seed): what ran, where, and per node its rounds, probe
    curve and held-out score."""
    t0, cpu0 = time.monotonic(), time.process_time()
    nodes = []
    for i, run_dir in enumerate(run_dirs):
        nodes.append(summarize_node(i, seed, run_dir, args))
        scored = nodes[-1]["eval"]
        score = f"{scored['pass@1']:.3f}" if scored else "none (no final checkpoint)"
        print(f"{arm.name} seed {seed} node{i}: held-out pass@1 {score}", file=sys.stderr)
    config = args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config
    setup = {
        "config": str(config), "sets": args.set, "groups": args.groups, "rounds": args.rounds,
        "probe_every": args.probe_every, "probe_questions": args.probe_questions,
        "eval_per_task": args.eval_per_task, "specialise": args.split,
    }  # fmt: skip
    return {
        "arm": arm.name, "seed": seed, "table": arm.table, "what": arm.what, "local": arm.local,
        "peer": arm.peer, "arm_sets": list(arm.sets), "setup": setup,
        "command": script_command(), "node_command": info["node_command"],
        "machine": args.machine, "machine_line": describe_machine(args.machine, now=False),
        "wall_s": info["wall_s"], "eval_s": round(time.monotonic() - t0, 1),
        "eval_cpu_s": round(time.process_time() - cpu0, 1), "nodes_cpu_s": info["nodes_cpu_s"],
        "exit_codes": info["exit_codes"],
        "load_before": info["load_before"], "load_after": info["load_after"], "nodes": nodes,
    }  # fmt: skip


def run_and_summarize(arm: Arm, seed: int, args: argparse.Namespace) -> bool:
    """One (arm, seed): run, evaluate, write its summary, drop its checkpoints. False if it fell short."""
    print(f"{arm.name} seed {seed}: {arm.what}, {arm_nodes(arm, args)} nodes x {args.rounds} rounds ...",
          file=sys.stderr)  # fmt: skip
    run_dirs = node_dirs(arm, seed, args)
    try:  # the checkpoints go in every case: a node stopped by Ctrl-C writes one too
        info = run_part(arm, seed, args, run_dirs)
        rounds_done = rounds_per_node(run_dirs)
        if info["timed_out"] or min(rounds_done) < args.rounds:
            print(
                f"{arm.name} seed {seed}: INCOMPLETE (timed out: {info['timed_out']}, rounds per node "
                f"{rounds_done}); no summary written, run it again",
                file=sys.stderr,
            )
            return False
        path = summary_path(args.summaries, arm.name, seed)
        with (
            one_at_a_time(EVALUATION_LOCK, f"{arm.name} seed {seed}", EVALUATION_WAIT_S),
            behind_other_sessions(),
        ):
            summary = summarize(arm, seed, args, info, run_dirs)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(dump(summary))
        path.with_suffix(".tmp").replace(path)  # a summary on disk is a finished part
        print(f"{arm.name} seed {seed}: done in {info['wall_s']:.0f} s + {summary['eval_s']:.0f} s of "
              f"evaluation; {path}", file=sys.stderr)  # fmt: skip
        return True
    finally:
        if not args.keep_checkpoints:
            drop_checkpoints(run_dirs)


def task_split(args: argparse.Namespace) -> TaskSplit | None:
    """``--specialise``'s two tasks with their configs, also kept in ``args.split`` for the summaries."""
    from swarmnode.config import load_config

    args.split = None
    if not args.specialise:
        return None
    base_mix = {name: spec.config for name, spec in load_config(args.config).tasks.mix.items()}
    split = parse_split(args.specialise, base_mix)
    args.split = split.configs
    return split


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
    parser.add_argument(
        "--arms", nargs="+", default=None, help="run only these arms, silo-L for any L (default: all)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="seeds to run, each a part per arm")
    parser.add_argument("--set", action="append", default=[], help="extra config override for every node")
    parser.add_argument("--deadline", type=float, default=600.0, help="swarm.share_deadline_s (lockstep)")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--round-timeout", type=float, default=600.0, help="time allowed per round (s)")
    parser.add_argument(
        "--eval-per-task",
        type=int,
        default=500,
        help="held-out questions per task of a node's mix, at the end",
    )
    parser.add_argument(
        "--probe-every", type=int, default=5, help="probe.every_rounds of every node (0: no probe)"
    )
    parser.add_argument(
        "--probe-questions", type=int, default=None, help="probe.questions_per_task (default: the node's)"
    )
    parser.add_argument(
        "--specialise", nargs=2, default=None, metavar="TASK",
        help="tasks A and B of the specialist arms, each NAME (config from --config's mix, else the "
        "dataset's defaults) or NAME=<YAML mapping>, e.g. 'basic_arithmetic={max_digits: 2}'",
    )  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "sapo", help="run folders")
    parser.add_argument(
        "--summaries", type=Path, default=REPO / "docs" / "sapo", help="one JSON per finished (arm, seed)"
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=REPO / "docs" / "sapo-table.md",
        help="with --report-only: its markdown",
    )
    parser.add_argument(
        "--plot", type=Path, default=REPO / "docs" / "sapo-seeds.png", help="with --report-only: its PNG"
    )
    parser.add_argument("--window", type=int, default=5, help="moving-average window of the plot")
    parser.add_argument("--fresh", action="store_true", help="re-run parts whose summary exists")
    parser.add_argument(
        "--keep-checkpoints", action="store_true", help="keep each node's final checkpoint (1.6 GB each)"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing: the report from --summaries alone"
    )
    args = parser.parse_args()
    if args.report_only:
        parts = load_summaries(args.summaries)
        if not parts:
            print(f"no summaries in {args.summaries}", file=sys.stderr)
            return 1
        plot(parts, args.plot, args.window)
        write_report(args.report, report(parts, os.path.relpath(args.plot, args.report.parent)))
        print(f"report: {args.report}\nplot: {args.plot}", file=sys.stderr)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through run_part's stop_all
    # a script started in the background by a shell inherits SIGINT ignored, and so would its nodes, which
    # stop_all ends with SIGINT: restore Python's handler (the nodes then get the default after exec)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args.config = args.config.resolve()
    try:
        selected = select_arms(
            args.arms, build_arms(args.groups, args.splits, args.replay_groups, task_split(args))
        )
    except ValueError as exc:
        parser.error(str(exc))
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.machine = machine_info("benchmarks.sapo_table")
    print(f"machine: {describe_machine(args.machine)}", file=sys.stderr)
    rivals = args.machine["other_swarmnode_processes"]
    if rivals:
        print(
            f"note: {len(rivals)} other swarmnode processes compete for the CPU, e.g. {rivals[0]}",
            file=sys.stderr,
        )
    todo = pending([a.name for a in selected], args.seeds, args.summaries, args.fresh)
    for arm in selected:
        for seed in args.seeds:
            if (arm.name, seed) not in todo:
                print(
                    f"{arm.name} seed {seed}: summary exists, skipped (--fresh runs it again)",
                    file=sys.stderr,
                )
    by_name = {a.name: a for a in selected}
    finished = [run_and_summarize(by_name[name], seed, args) for name, seed in todo]
    return 0 if all(finished) else 1


if __name__ == "__main__":
    sys.exit(main())
