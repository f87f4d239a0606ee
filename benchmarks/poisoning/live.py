"""The poisoning harness over the network: a real ``swarmnode join`` node, and the attacker as a process of
its own (``live_host``) on loopback.

    python -m benchmarks.poisoning.live --payload credentials --defence span_drift_recurring --rounds 40

The harness without a network (``run.run_arm``) drives the node's round itself and hands it the attackers'
batches; here nothing is handed over. The node is the ``swarmnode join`` a user runs, with the arm's
config overrides (``run.ArmSpec.overrides``: seeds, J, the defence) and ``swarm.min_peers`` 1; the attacker
process joins its DHT through its address, stores its identities' cards, and each time the node begins a
round publishes a batch per identity, which the node finds by notice, pulls over a libp2p stream, verifies,
pools and chooses from as it would any peer's. The measures (``measure.Yardstick``) are taken here, on a
copy of the node's model: on the base weights (round 0) and on each checkpoint the node writes
(``run.checkpoint_every`` = ``--every``) as it appears, and on its last. What the node trained on, gated and
rejected comes from its own run folder (metrics.jsonl, status.json).

The summary has the in-process one's shape (``run.summary``) with ``"live": true``, in
``docs/poisoning/live/`` by default, rewritten at each checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.harness.processes import read_jsonl, start_node
from benchmarks.machine import describe_machine, machine_info
from benchmarks.poisoning import payloads
from benchmarks.poisoning.run import (
    DEFAULT_CONFIG,
    ArmRun,
    ArmSpec,
    arm_config,
    make_planner,
    summary,
    template_opening,
    write_summary,
)
from benchmarks.reliability import sybils

WAIT_FOR_ATTACKER_S = 600.0  # the node waits this long for its first peer (the attacker mints and plans)
POLL_S = 2.0  # how often the node's checkpoints are looked for
ROUND_TIMEOUT_S = 1800.0  # longest a round may take before the run is given up
STOP_TIMEOUT_S = 60.0  # the attacker's clean shutdown, before it is killed


def node_args(spec: ArmSpec, swarm_id: str) -> list[str]:
    """``swarmnode join``'s arguments for the arm: its overrides, one peer wanted, checkpoints to measure."""
    sets = {
        **spec.overrides(),
        "swarm.swarm_id": swarm_id,
        "swarm.min_peers": 1,
        "swarm.wait_for_peers_s": WAIT_FOR_ATTACKER_S,
        "run.checkpoint_every": spec.every,
    }
    args = ["--config", spec.config, "--rounds", str(spec.rounds)]
    for key, value in sets.items():
        args += ["--set", f"{key}={'null' if value is None else value}"]
    return args


def checkpoints_after(root: Path, after: int) -> list:
    """The node's valid checkpoints of rounds past ``after``, oldest first (``swarmnode.checkpoint``)."""
    from swarmnode import checkpoint

    found = []
    for path in reversed(checkpoint.candidates(root)):
        with contextlib.suppress(ValueError, OSError):  # a folder being pruned
            info = checkpoint.validate(path)
            if info.round > after:
                found.append(info)
    return found


def yardstick(spec: ArmSpec, cfg, work: Path):
    """The measures' own copy of the node (the base weights; the node's checkpoints are loaded into it)."""
    from benchmarks.poisoning.measure import Yardstick
    from swarmnode.policy import load_policy
    from swarmnode.probe import PROBE_FILE, Probe
    from swarmnode.runlog import RunLog
    from swarmnode.sampler import make_sampler
    from swarmnode.tasks import TaskBank

    bank = TaskBank(cfg.tasks, default_seed=0)  # the measures read the eval stream, not the node's own
    policy = load_policy(cfg.model, seed=cfg.train.seed)
    probe = Probe(cfg, bank, policy, RunLog(work, PROBE_FILE))
    sampler = make_sampler(cfg.sampling, policy, seed=cfg.train.seed)
    fluent = spec.payload in payloads.FLUENT_KINDS
    opening = make_planner(spec, cfg, bank, policy).opening if fluent else template_opening(spec.payload)
    measure = Yardstick(
        cfg, bank, policy, sampler, probe, questions=spec.questions, prompts=spec.prompts,
        payload=spec.payload, opening=opening, greedy=spec.greedy,
    )  # fmt: skip
    return measure, policy


def run_live(spec: ArmSpec, work: Path, summary_dir: Path, extra: dict) -> Path:
    """Run the arm over the network (module docstring); returns its summary's path."""
    from swarmnode import checkpoint

    swarm_id = f"poison-{uuid.uuid4().hex[:10]}"
    cfg = arm_config(spec, work / "measure")
    node = start_node(work / "node", *node_args(spec, swarm_id))
    host = None
    try:
        host_spec = json.dumps({**dataclasses.asdict(spec), "sets": list(spec.sets)})
        host = sybils.spawn_host(
            "benchmarks.poisoning.live_host", work / "attacker", swarm_id, node.address(), host_spec
        )
        ready = host.ready()
        print(f"attacker up: identities {ready['peers']} on host {ready['host']}", flush=True)
        measure, policy = yardstick(spec, cfg, work / "measure")
        run = ArmRun(spec, cfg, ready["peers"])
        t0, written = time.perf_counter(), None

        def take(round_: int, complete: bool = False) -> None:
            nonlocal written
            run.checkpoints.append(measure.take(round_))
            status = node.status() if (work / "node" / "status.json").exists() else {}  # after its round 1
            run.rounds = read_jsonl(work / "node" / "metrics.jsonl")
            run.rejections = status.get("rejected", {})
            run.accepted_groups = status.get("rollouts", {}).get("groups_accepted", 0)
            run.wall_s, run.complete = time.perf_counter() - t0, complete
            written = write_summary(
                summary_dir, {**summary(run, extra), "live": True, "published": host.said("PUBLISHED")}, spec
            )
            c = run.checkpoints[-1]
            print(
                f"round {round_}: payload {c.logprob_token[spec.payload]:.3f} nats/token, "
                f"shown {c.attack}; {written}",
                flush=True,
            )

        take(0)
        measured, last_seen = 0, time.monotonic()
        while True:
            exited = node.proc.poll() is not None  # before the look: its last checkpoint is then on disk
            for info in checkpoints_after(work / "node" / "checkpoints", measured):
                checkpoint.load_model_weights(info, policy.model)
                measured, last_seen = info.round, time.monotonic()
                take(info.round, complete=info.round >= spec.rounds)
            if measured >= spec.rounds:
                break
            if exited:
                raise RuntimeError(f"the node stopped at round {measured}:\n{node.output()[-4000:]}")
            if time.monotonic() - last_seen > ROUND_TIMEOUT_S * spec.every:
                raise RuntimeError(
                    f"no checkpoint past round {measured} in {ROUND_TIMEOUT_S * spec.every:.0f}s"
                )
            time.sleep(POLL_S)
        node.wait(timeout_s=300)
        return written
    finally:
        if host is not None:  # ours, by its PID: SIGTERM shuts its DHT and p2pd down, then it exits
            host.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                host.proc.wait(timeout=STOP_TIMEOUT_S)
            host.stop()
        node.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payload", choices=payloads.KINDS, default="credentials")
    parser.add_argument(
        "--defence", default="span_drift_recurring", help="offpolicy.peer_defence of the node"
    )
    parser.add_argument(
        "--control", action="store_true", help="the honest control: clean answers, same seeds"
    )
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--every", type=int, default=10, help="checkpoint and measure every k rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--greedy", type=int, default=64)
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--summary-dir", type=Path, default=Path("docs/poisoning/live"))
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="keep the node's and attacker's folders here"
    )
    args = parser.parse_args()
    spec = ArmSpec(
        defence=args.defence, payload=args.payload, control=args.control, seed=args.seed, rounds=args.rounds,
        every=args.every, questions=args.questions, prompts=args.prompts, greedy=args.greedy,
        config=args.config, sets=tuple(args.sets),
    )  # fmt: skip
    arm_config(spec)  # a bad override fails here, before any process starts
    machine = machine_info("benchmarks.poisoning.live")
    command = "python -m benchmarks.poisoning.live " + shlex.join(sys.argv[1:])
    extra = {"command": command, "machine": machine, "machine_line": describe_machine(machine, now=False)}
    print(f"machine: {describe_machine(machine)}", flush=True)
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="swarmnode-live-"))
        )
        path = run_live(spec, work, args.summary_dir, extra)
    print(f"{spec.name}: summary {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
