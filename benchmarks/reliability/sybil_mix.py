"""The Sybil mix against a small honest swarm, shared by its test and benchmark (``check``: what must hold).

``run_mix`` starts ``nodes`` honest ``swarmnode join`` processes (``honest_swarm``: tiny.yaml, share
traces on) on 127.0.0.1. Once each has finished a round it starts ONE hostile process (``mix_host``)
holding ``identities`` identities with the swarm's identity work, split by ``MIX_SHARES`` into canned
(valid batches of canned text that score: the cheapest route to standing), silent (announce, never
serve), future-dated (timestamps signed 25 s ahead; canned batches) and newcomer churn (fresh identities
every refresh, some publishing canned batches). The attack goes on for ``attack_s`` while every node
keeps running rounds; a watcher reads each honest node's status.json every STATUS_EVERY_S (which peers
hold standing there, which hold roster seats).

What the report says per honest node, of its rounds whose exchange began after the attacker was ready and
ended before anything was stopped:

- ``trained``: the peer groups it chose for training (peer_groups.jsonl, the audit trail; the groups that
  earn their producer standing) by the producer's kind (``honest``, the mix's four kinds, ``unknown``)
  and the honest share;
- ``share_phase``: how many rounds, the longest share phase (metrics.jsonl ``seconds_share``: publishing,
  the wait for peers, the choice of groups) and the rounds past ``share_deadline_s`` + DEADLINE_SLACK_S
  (with what ended their wait, from the share trace); the longest share phase before the attack, to
  compare;
- ``pulls``: the batches it pulled, by the author's kind: verified (and their groups) or failed, by reason;
- ``standing``: per kind, the most identities holding standing at once, how many ever did, and the most
  roster seats held at once.

And the hostile process's own figures (its ``MIX`` lines). Every wait is bounded; only processes this
module started are ended, by PID.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

from benchmarks.harness.periodic import Periodic
from benchmarks.harness.processes import NodeProc, read_jsonl, stop_all
from benchmarks.reliability import honest_swarm, sybils
from benchmarks.reliability.honest_swarm import CONFIG, errors, peer_id, read_status
from benchmarks.reliability.mix_host import KINDS

# the mix's kinds, as shares of its identities (the rest of a division goes to churn)
MIX_SHARES = {"canned": 0.25, "silent": 0.25, "future": 0.25}
STATUS_EVERY_S = 2.0


def run_mix(
    workdir: Path,
    *,
    nodes: int = 4,
    identities: int = 256,
    attack_s: float = 180.0,
    deadline_s: float = 6.0,
    time_limit_s: float = 900.0,
) -> dict:
    """Run the mix and return its report (module docstring)."""
    counts = {kind: int(identities * MIX_SHARES.get(kind, 0.0)) for kind in KINDS}
    counts["churn"] = identities - sum(counts.values())
    swarm_id = f"mix-{os.getpid()}-{int(time.time())}"
    started = time.monotonic()
    honest: list[NodeProc] = []
    hostile = watcher = None
    report: dict = {"nodes": nodes, "identities": identities, "mix": counts, "attack_s": attack_s,
                    "deadline_s": deadline_s}  # fmt: skip
    try:
        with honest_swarm.share_traces():
            until = started + time_limit_s
            address = honest_swarm.start_honest(workdir, swarm_id, nodes, deadline_s, until, honest)
        hostile = sybils.spawn_host(
            "benchmarks.reliability.mix_host", workdir / "hostile", swarm_id, address, CONFIG,
            *(counts[kind] for kind in KINDS),
        )  # fmt: skip
        report["hostile_ready"] = hostile.ready()
        attack_started = time.time()
        watcher = StandingWatcher(honest).start()
        deadline = min(time.monotonic() + attack_s, until)
        while time.monotonic() < deadline and all(node.proc.poll() is None for node in honest):
            time.sleep(1.0)
        attack_ended = time.time()
        running = {node.run_dir.name: node.proc.poll() is None for node in honest}
        ids = {node.run_dir.name: peer_id(node) for node in honest}
    finally:
        if watcher is not None:
            watcher.stop()
        if hostile is not None:
            hostile.stop()
        stop_all(honest)
    honest_swarm.save_logs(honest)
    kinds = producer_kinds(workdir / "hostile" / "identities.json", set(ids.values()))
    window = (attack_started, attack_ended)
    report.update(
        wall_s=round(time.monotonic() - started, 1),
        running=running,
        error_lines={node.run_dir.name: errors(node) for node in honest},
        hostile=hostile.said("MIX"),
        hostile_errors=hostile.said("ERROR")[:10],
        per_node={
            node.run_dir.name: node_report(node, kinds, window, deadline_s, watcher.samples[i])
            for i, node in enumerate(honest)
        },
    )
    return report


class StandingWatcher(Periodic):
    """Reads the honest nodes' status.json every STATUS_EVERY_S: per node, a list of samples (the peers
    holding standing there, the peers in its roster)."""

    def __init__(self, honest: list[NodeProc]):
        super().__init__(STATUS_EVERY_S)
        self.honest = honest
        self.samples: list[list[tuple[frozenset[str], frozenset[str]]]] = [[] for _ in honest]

    def tick(self) -> None:
        for node, samples in zip(self.honest, self.samples, strict=True):
            peers = read_status(node).get("peers", {})
            standing = frozenset(peer for peer, p in peers.items() if p.get("standing"))
            samples.append((standing, frozenset(peers)))


def producer_kinds(identities_file: Path, honest_ids: set[str]) -> dict[str, str]:
    """Peer id -> "honest" or the hostile identity's kind (from the hostile process's identities.json)."""
    try:
        identities = json.loads(identities_file.read_text())
    except (OSError, ValueError):
        identities = {}
    kinds = {peer: kind for kind in KINDS for peer in identities.get(kind, [])}
    return {**kinds, **dict.fromkeys(honest_ids, "honest")}


def node_report(
    node: NodeProc,
    kinds: dict[str, str],
    window: tuple[float, float],
    deadline_s: float,
    samples: list[tuple[frozenset[str], frozenset[str]]],
) -> dict:
    """One honest node's figures for its rounds within ``window`` (module docstring)."""
    trace = read_jsonl(node.run_dir / "share.jsonl")
    exchanges = {e["round"]: e for e in trace if e["event"] == "exchange"}
    rounds = {r for r, e in exchanges.items() if e["started"] >= window[0] and e["ended"] <= window[1]}
    kind = lambda peer: kinds.get(peer, "unknown")  # noqa: E731
    trained = Counter(kind(g["producer"]) for g in read_jsonl(node.run_dir / "peer_groups.jsonl")
                      if g["round"] in rounds)  # fmt: skip
    total = sum(trained.values())
    metrics = {m["round"]: m for m in read_jsonl(node.run_dir / "metrics.jsonl")}
    share_s = {r: metrics[r]["seconds_share"] for r in rounds if r in metrics}
    before = [m["seconds_share"] for r, m in metrics.items() if r in exchanges and r not in rounds
              and exchanges[r]["ended"] < window[0]]  # fmt: skip
    past = sorted(r for r, s in share_s.items() if s > deadline_s + DEADLINE_SLACK_S)
    return {
        "trained": dict(trained),
        "honest_share": trained["honest"] / total if total else float("nan"),
        "share_phase": {
            "rounds": len(share_s),
            "max_s": round(max(share_s.values(), default=0.0), 2),
            "max_before_attack_s": round(max(before, default=0.0), 2),
            "ended_by": dict(Counter(exchanges[r].get("ended_by", "") for r in share_s)),
            "past_deadline": [
                {"round": r, "seconds_share": round(share_s[r], 2), "ended_by": exchanges[r].get("ended_by")}
                for r in past
            ],
        },
        "pulls": _pulls(trace, kind, window),
        "standing": _standing(samples, kind),
        "status": honest_swarm.status_summary(node),
    }


def _pulls(trace: list[dict], kind, window: tuple[float, float]) -> dict:
    """The batches pulled in ``window``, by the author's kind: verified (groups pooled) or failed."""
    out: dict[str, dict] = {}
    for e in trace:
        if e["event"] != "batch" or not window[0] <= e.get("fetch_started", 0.0) <= window[1]:
            continue
        row = out.setdefault(kind(e["peer"]), {"verified": 0, "groups": 0, "failed": Counter()})
        if "error" in e:
            row["failed"][e["error"]] += 1
        else:
            row["verified"] += 1
            row["groups"] += e.get("groups", 0)
    return {k: {**row, "failed": dict(row["failed"])} for k, row in out.items()}


def _standing(samples: list[tuple[frozenset[str], frozenset[str]]], kind) -> dict:
    """Per kind: the most peers with standing at once, how many ever had it, the most roster seats."""
    out: dict[str, dict] = {}
    for standing, roster in samples:
        for name, peers in (("standing", standing), ("seats", roster)):
            by_kind = Counter(kind(peer) for peer in peers)
            for k, n in by_kind.items():
                row = out.setdefault(k, {"max_standing": 0, "ever_standing": set(), "max_seats": 0})
                row["max_" + name] = max(row["max_" + name], n)
        for peer in standing:
            out[kind(peer)]["ever_standing"].add(peer)
    return {k: {**row, "ever_standing": len(row["ever_standing"])} for k, row in out.items()}


# what must hold under the mix (issue #45's acceptance): the honest nodes train mostly on honest groups
# and no round's share phase runs past its deadline, but for the work after the wait (choosing the groups,
# the audit line, status.json)
MIN_HONEST_SHARE = 0.9
DEADLINE_SLACK_S = 1.0
MIN_IDENTITIES = 256
MIN_ATTACK_ROUNDS = 5  # rounds of every honest node under attack, or the run says nothing


def check(report: dict) -> list[str]:
    """Everything that makes the mix a failure, as readable lines ([] = it held)."""
    problems = []
    if report["identities"] < MIN_IDENTITIES:
        problems.append(f"the hostile process held {report['identities']} identities (< {MIN_IDENTITIES})")
    problems += [
        f"{name} stopped before the attack was over" for name, up in report["running"].items() if not up
    ]
    problems += [f"{name} logged {lines[0]!r}" for name, lines in report["error_lines"].items() if lines]
    for name, node in report["per_node"].items():
        rounds = node["share_phase"]["rounds"]
        if rounds < MIN_ATTACK_ROUNDS:
            problems.append(f"{name}: {rounds} rounds under attack (< {MIN_ATTACK_ROUNDS})")
        if not node["honest_share"] >= MIN_HONEST_SHARE:  # NaN (nothing trained) fails too
            problems.append(
                f"{name}: {node['honest_share']:.0%} of its trained peer groups from honest peers "
                f"(< {MIN_HONEST_SHARE:.0%}): {node['trained']}"
            )
        if node["share_phase"]["past_deadline"]:
            problems.append(
                f"{name}: share phase past {report['deadline_s']} s + {DEADLINE_SLACK_S} s: "
                f"{node['share_phase']['past_deadline']}"
            )
    return problems
