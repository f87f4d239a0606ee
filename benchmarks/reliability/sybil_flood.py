"""A Sybil flood against a small honest swarm, shared by its test and benchmark (``check``: what must hold).

``run_flood`` starts ``nodes`` honest ``swarmnode join`` processes (``honest_swarm``: node_configs/tiny.yaml,
the share trace on) on 127.0.0.1. Once they have all finished a round it starts ``hosts`` attacker processes
(``python -m benchmarks.reliability.sybil_flood``), each a real libp2p host that joins the swarm's DHT and
speaks for its share of ``identities`` fresh Sybil identities, each minted at the swarm's identity work
(``sybils``: what a host and a Sybil are):

- **cards**: a valid roster card per identity, stored in the DHT (the roster shards) and carried by
  notices;
- **announcements**: one per identity and refresh, of a batch that does not exist, stored in the DHT
  and pushed as notices to every honest node (from the host's own libp2p identity: the holder);
- **silent holders**: the hosts accept every pull stream and never answer;
- **DHT stores**: all of the above are stores into every storing node's bounded storage.

It refreshes everything every ``REFRESH_S``. Then an honest newcomer joins, and the flood goes on for
``flood_s`` while every node keeps running rounds; the honest nodes' process trees are sampled
(``soak.Sampler``: memory) and, before anything is stopped, whether their DHT processes still live.

What the report says: per honest (batch, receiver) pair whether the receiver pulled it before the
publisher's next round began (``pulled_before_next_round``, from the share traces); how long the
newcomer took to be in an honest roster and to have a batch accepted by an honest node; the honest
nodes' peak memory and whether any DHT process died; what the honest nodes refused and dropped.

Every wait is bounded; only processes this module started are ended, by PID.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.harness.periodic import Periodic
from benchmarks.harness.processes import NodeProc, read_jsonl, start_node, stop_all
from benchmarks.reliability import honest_swarm, sybils
from benchmarks.reliability.honest_swarm import CONFIG, alive, errors, join_args, peer_id, read_status
from benchmarks.reliability.soak import Sampler, _tree

REFRESH_S = 10.0  # the attackers re-store and re-announce everything this often
HOST_LIFETIME_S = 600.0  # an attacker host that is never ended stops by itself after this long


# ---------------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------------
def run_flood(
    workdir: Path,
    *,
    nodes: int = 4,
    identities: int = 512,
    hosts: int = 4,
    flood_s: float = 120.0,
    deadline_s: float = 6.0,
    time_limit_s: float = 900.0,
) -> dict:
    """Run the flood and return its report (module docstring)."""
    swarm_id = f"flood-{os.getpid()}-{int(time.time())}"
    started = time.monotonic()
    honest: list[NodeProc] = []
    attackers: list[sybils.HostProc] = []
    sampler = watcher = newcomer = None
    report: dict = {"nodes": nodes, "identities": identities, "hosts": hosts, "flood_s": flood_s}
    try:
        with honest_swarm.share_traces():  # the nodes' share traces: what pulled what, when
            until = started + time_limit_s
            address = honest_swarm.start_honest(workdir, swarm_id, nodes, deadline_s, until, honest)
            dht_pids = {node.run_dir.name: [p.pid for p in _tree(node.proc.pid)["dht"]] for node in honest}
            sampler = Sampler(honest, 1.0).start()
            for h in range(hosts):
                attackers.append(sybils.spawn_host(
                    "benchmarks.reliability.sybil_flood", workdir / f"attacker{h}", swarm_id, address, CONFIG,
                    identities // hosts,
                ))  # fmt: skip
            for attacker in attackers:
                attacker.ready(timeout_s=300.0)
            flood_started = time.time()
            newcomer = start_node(workdir / "newcomer", *join_args(swarm_id, 1, deadline_s), peers=[address])
        newcomer.wait_for_line(f"swarm {swarm_id}: peer id", 300.0)  # its swarm is up: it announces itself
        newcomer_started = time.time()
        watcher = RosterWatcher(honest, newcomer).start()
        # the flood goes on for flood_s with the newcomer in it; every node must still be running then
        deadline = min(time.monotonic() + flood_s, started + time_limit_s)
        while time.monotonic() < deadline and all(node.proc.poll() is None for node in [*honest, newcomer]):
            time.sleep(1.0)
        running = {node.run_dir.name: node.proc.poll() is None for node in [*honest, newcomer]}
        dht_alive = {name: bool(pids) and all(alive(pid) for pid in pids) for name, pids in dht_pids.items()}
    finally:
        for part in (sampler, watcher):
            if part is not None:
                part.stop()
        for attacker in attackers:
            attacker.stop()
        stop_all([*honest, *([newcomer] if newcomer is not None else [])])
    honest_swarm.save_logs([*honest, newcomer])
    report.update(
        wall_s=round(time.monotonic() - started, 1),
        running=running,
        error_lines={node.run_dir.name: errors(node) for node in [*honest, newcomer]},
        dht_alive=dht_alive,
        flood=[said for attacker in attackers for said in attacker.said("FLOOD")],
        pulled_before_next_round=pulled_before_next_round(honest, since=flood_started),
        newcomer=newcomer_times(honest, newcomer, newcomer_started, watcher.first_seen),
        peak_kib=_peaks(sampler),
        honest_status={node.run_dir.name: honest_swarm.status_summary(node) for node in honest},
    )
    return report


class RosterWatcher(Periodic):
    """Reads the honest nodes' status.json every 0.5 s: when the newcomer first shows in a roster."""

    def __init__(self, honest: list[NodeProc], newcomer: NodeProc):
        super().__init__(0.5)
        self.honest, self.newcomer = honest, newcomer
        self.first_seen: float | None = None

    def tick(self) -> None:
        if self.first_seen is not None:
            return
        newcomer = peer_id(self.newcomer)
        if newcomer and any(newcomer in read_status(node).get("peers", {}) for node in self.honest):
            self.first_seen = time.time()


def pulled_before_next_round(honest: list[NodeProc], since: float) -> dict:
    """Of the honest batches published after ``since`` (the publisher's last round left out), the share
    of (batch, honest receiver) pairs pulled before the publisher's next round began (exchange end + its
    training and weight sync: swarm_latency's measure)."""
    ids = {node.run_dir.name: peer_id(node) for node in honest}
    traces = {node.run_dir.name: read_jsonl(node.run_dir / "share.jsonl") for node in honest}
    fetched = {  # (receiver, publisher's peer id, round) -> when its bytes arrived
        (name, e["peer"], e.get("round")): e["fetched"]
        for name, events in traces.items()
        for e in events
        if e["event"] == "batch" and "error" not in e
    }
    pairs = delivered = 0
    for node in honest:
        name = node.run_dir.name
        metrics = {m["round"]: m for m in read_jsonl(node.run_dir / "metrics.jsonl")}
        exchanges = {e["round"]: e for e in traces[name] if e["event"] == "exchange"}
        for pub in traces[name]:
            r = pub.get("round")
            if (
                pub["event"] != "publish"
                or pub["started"] < since
                or r not in metrics
                or r + 1 not in exchanges
            ):
                continue
            next_start = exchanges[r]["ended"] + metrics[r]["seconds_train"] + metrics[r]["seconds_sync"]
            for receiver in traces:
                if receiver != name:
                    pairs += 1
                    delivered += fetched.get((receiver, ids[name], r), float("inf")) <= next_start
    return {"pairs": pairs, "delivered": delivered, "share": delivered / pairs if pairs else float("nan")}


def newcomer_times(
    honest: list[NodeProc], newcomer: NodeProc, started: float, first_seen: float | None
) -> dict:
    """Seconds from the newcomer's joining (its swarm up, its card out: ``started``) until an honest
    roster held its card, and until an honest node had verified a batch of it (None: never)."""
    peer = peer_id(newcomer)
    accepted = [
        e["verified"] for node in honest for e in read_jsonl(node.run_dir / "share.jsonl")
        if e["event"] == "batch" and e["peer"] == peer and "verified" in e and e.get("groups", 0) > 0
    ]  # fmt: skip
    published = [
        e["started"] for e in read_jsonl(newcomer.run_dir / "share.jsonl") if e["event"] == "publish"
    ]
    return {
        "in_a_roster_s": None if first_seen is None else round(first_seen - started, 1),
        "first_publish_s": round(min(published) - started, 1) if published else None,
        "batch_verified_s": round(min(accepted) - started, 1) if accepted else None,
    }


def _peaks(sampler: Sampler | None) -> dict:
    if sampler is None:
        return {}
    return {
        node.run_dir.name: {
            what: max((s.values[what] for s in trace.samples), default=0.0)
            for what in ("rss_total", "anon_total")
        }
        for node, trace in zip(sampler.nodes, sampler.traces, strict=True)
    }


# ---------------------------------------------------------------------------------------------------
# the attacker host (its own process)
# ---------------------------------------------------------------------------------------------------
def attack(work_dir: Path, swarm_id: str, initial: str, config: str, count: int) -> None:
    """One attacker host: ``count`` Sybil identities' cards and announcements, stored and notified,
    refreshed every REFRESH_S; prints ``READY {json}`` once its first flood is out."""
    from swarmnode.config import load_config
    from swarmnode.tasks import TaskBank

    cfg = load_config(config)
    fingerprint = TaskBank(cfg.tasks, default_seed=0).fingerprint
    bits = cfg.swarm.identity_work_bits
    transport = sybils.start_host(work_dir / "host.key", swarm_id, initial, bits, silent=True)
    flood = sybils.mint(count, bits)
    sends = concurrent.futures.ThreadPoolExecutor(16)  # off the refresh's timer; records signed when sent
    jobs: dict[str, concurrent.futures.Future] = {}  # Sybil -> its flood job in flight (one at a time)
    started = time.monotonic()
    for refresh in range(int(HOST_LIFETIME_S / REFRESH_S)):
        honest = sybils.honest_peers(transport, swarm_id, ours=set())
        done = [peer for peer, job in jobs.items() if job.done()]
        sent = sum(jobs.pop(peer).result() for peer in done)
        for sybil in flood:
            if sybil.peer_id not in jobs:
                jobs[sybil.peer_id] = sends.submit(
                    _flood_one, transport, swarm_id, sybil, fingerprint, honest, 1 + refresh
                )
        if refresh == 0:
            print("READY " + json.dumps({"identities": count, "honest": len(honest)}), flush=True)
        print("FLOOD " + json.dumps({"refresh": refresh, "sent": sent, "in_flight": len(jobs)}), flush=True)
        time.sleep(max(started + (refresh + 1) * REFRESH_S - time.monotonic(), 0.0))
    transport.shutdown()


def _flood_one(
    transport, swarm_id: str, sybil: sybils.Sybil, fingerprint: str, honest: list[str], round_: int
) -> int:
    """One Sybil's fresh card and an announcement of a batch that does not exist: stored in the DHT and
    pushed to ``honest`` as notices (the card with them). How many of its records and notices were taken."""
    card = sybil.card(swarm_id, fingerprint)
    announcement = sybil.announcement(swarm_id, round_, os.urandom(32), 1024, 2)
    return sybils.send(transport, swarm_id, sybil, card, announcement=announcement, notify=honest)


if __name__ == "__main__":
    attack(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))


# what must hold under the flood (honest batches still pulled in time, a newcomer let in within a
# minute), and the memory bound measured for a tiny node under it
MIN_PULLED_SHARE = 0.9
NEWCOMER_LIMIT_S = 60.0
MAX_NODE_ANON_KIB = 1536 * 1024  # a tiny node's whole tree (node, DHT process, p2pd): ~0.8 GiB unflooded


def check(report: dict) -> list[str]:
    """Everything that makes the flood a failure, as readable lines ([] = it held)."""
    problems = []
    problems += [
        f"{name} stopped before the flood was over" for name, up in report["running"].items() if not up
    ]
    problems += [f"{name} logged {lines[0]!r}" for name, lines in report["error_lines"].items() if lines]
    problems += [f"{name}'s DHT process died" for name, up in report["dht_alive"].items() if not up]
    pulled = report["pulled_before_next_round"]
    if not pulled["share"] >= MIN_PULLED_SHARE:
        problems.append(f"honest batches pulled before the next round: {pulled}")
    newcomer = report["newcomer"]
    if newcomer["in_a_roster_s"] is None or newcomer["in_a_roster_s"] > NEWCOMER_LIMIT_S:
        problems.append(f"the newcomer was not in an honest roster within {NEWCOMER_LIMIT_S} s: {newcomer}")
    if newcomer["batch_verified_s"] is None or newcomer["batch_verified_s"] > NEWCOMER_LIMIT_S:
        problems.append(
            f"no batch of the newcomer verified by an honest node within {NEWCOMER_LIMIT_S} s: {newcomer}"
        )
    for name, peak in report["peak_kib"].items():
        if peak["anon_total"] > MAX_NODE_ANON_KIB:
            problems.append(
                f"{name}: {peak['anon_total']:.0f} KiB of anonymous memory (bound {MAX_NODE_ANON_KIB})"
            )
    return problems
