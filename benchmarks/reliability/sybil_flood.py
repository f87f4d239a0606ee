"""A Sybil flood against a small honest swarm, shared by its test and benchmark (``check``: what must hold).

``run_flood`` starts ``nodes`` honest ``swarmnode join`` processes (node_configs/tiny.yaml, the share
trace on) on 127.0.0.1. Once they have all finished a round it starts ``hosts`` attacker processes
(``python -m benchmarks.reliability.sybil_flood``), each a real libp2p host that joins the swarm's DHT and
speaks for its share of ``identities`` fresh Sybil identities, each minted at the swarm's identity work:

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

import asyncio
import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from benchmarks.harness.processes import (
    REPO,
    LineReader,
    NodeProc,
    node_env,
    read_jsonl,
    start_node,
    stop_all,
)
from benchmarks.reliability.soak import Sampler, _tree
from swarmnode.swarm.exchange.records import SHARE_TRACE_ENV

REFRESH_S = 10.0  # the attackers re-store and re-announce everything this often
HOST_LIFETIME_S = 600.0  # an attacker host that is never ended stops by itself after this long
SILENT_HOLD_S = 60.0  # a pull stream is held open, unanswered, this long
CONFIG = REPO / "node_configs" / "tiny.yaml"
MAX_ROUNDS = 10_000  # the nodes run until the flood is over and they are stopped
ERROR_MARKERS = ("Traceback", "CRITICAL", "EOFError", "Resource temporarily unavailable")


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

    def args(rounds_: int, min_peers: int) -> list[str]:
        return [
            "--config", str(CONFIG), "--rounds", str(rounds_),
            "--set", f"swarm.swarm_id={swarm_id}", "--set", f"swarm.min_peers={min_peers}",
            "--set", f"swarm.share_deadline_s={deadline_s}", "--set", "swarm.wait_for_peers_s=300",
            "--set", "run.checkpoint_every=1000", "--set", "run.cpu_threads=1",
        ]  # fmt: skip

    started = time.monotonic()
    honest: list[NodeProc] = []
    attackers: list[subprocess.Popen] = []
    readers: list[LineReader] = []
    sampler = watcher = newcomer = None
    report: dict = {"nodes": nodes, "identities": identities, "hosts": hosts, "flood_s": flood_s}
    old_trace = os.environ.get(SHARE_TRACE_ENV)
    os.environ[SHARE_TRACE_ENV] = "1"  # the nodes' share traces: what pulled what, when
    try:
        honest.append(start_node(workdir / "node00", *args(MAX_ROUNDS, nodes - 1)))
        address = honest[0].address(timeout_s=300.0)
        for i in range(1, nodes):
            honest.append(start_node(workdir / f"node{i:02d}", *args(MAX_ROUNDS, nodes - 1), peers=[address]))
        for node in honest:
            node.wait_for_round(1, timeout_s=max(started + time_limit_s - time.monotonic(), 1.0))
        dht_pids = {node.run_dir.name: [p.pid for p in _tree(node.proc.pid)["dht"]] for node in honest}
        sampler = Sampler(honest, 1.0).start()
        for h in range(hosts):
            cmd = [sys.executable, "-m", "benchmarks.reliability.sybil_flood", str(workdir / f"attacker{h}"),
                   swarm_id, address, str(CONFIG), str(identities // hosts)]  # fmt: skip
            attackers.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True, env=node_env()))  # fmt: skip
        readers += [LineReader(a.stdout) for a in attackers]
        for reader in readers:
            reader.wait_for_line(
                lambda line: line.startswith("READY "), 300.0, lambda r=reader: "\n".join(r.lines[-20:])
            )
        flood_started = time.time()
        newcomer = start_node(workdir / "newcomer", *args(MAX_ROUNDS, 1), peers=[address])
        newcomer.wait_for_line(f"swarm {swarm_id}: peer id", 300.0)  # its swarm is up: it announces itself
        newcomer_started = time.time()
        watcher = RosterWatcher(honest, newcomer).start()
        # the flood goes on for flood_s with the newcomer in it; every node must still be running then
        deadline = min(time.monotonic() + flood_s, started + time_limit_s)
        while time.monotonic() < deadline and all(node.proc.poll() is None for node in [*honest, newcomer]):
            time.sleep(1.0)
        running = {node.run_dir.name: node.proc.poll() is None for node in [*honest, newcomer]}
        dht_alive = {name: bool(pids) and all(_alive(pid) for pid in pids) for name, pids in dht_pids.items()}
    finally:
        for part in (sampler, watcher):
            if part is not None:
                part.stop()
        for proc in attackers:
            proc.kill()  # ours, by PID
            proc.wait(timeout=30)
        stop_all([*honest, *([newcomer] if newcomer is not None else [])])
        if old_trace is None:
            os.environ.pop(SHARE_TRACE_ENV, None)
        else:
            os.environ[SHARE_TRACE_ENV] = old_trace
    for node in [*honest, newcomer]:
        (node.run_dir / "node.log").write_text("\n".join(node.lines) + "\n")
    for h, reader in enumerate(readers):
        (workdir / f"attacker{h}" / "attacker.log").write_text("\n".join(reader.lines) + "\n")
    report.update(
        wall_s=round(time.monotonic() - started, 1),
        running=running,
        error_lines={node.run_dir.name: _errors(node) for node in [*honest, newcomer]},
        dht_alive=dht_alive,
        flood=[
            json.loads(line.split(" ", 1)[1])
            for reader in readers
            for line in reader.lines
            if line.startswith("FLOOD ")
        ],
        pulled_before_next_round=pulled_before_next_round(honest, since=flood_started),
        newcomer=newcomer_times(honest, newcomer, newcomer_started, watcher.first_seen),
        peak_kib=_peaks(sampler),
        honest_status={node.run_dir.name: _status_summary(node) for node in honest},
    )
    return report


class RosterWatcher:
    """Reads the honest nodes' status.json every 0.5 s: when the newcomer first shows in a roster."""

    def __init__(self, honest: list[NodeProc], newcomer: NodeProc):
        self.honest, self.newcomer = honest, newcomer
        self.first_seen: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> RosterWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.5) and self.first_seen is None:
            newcomer = _peer_id(self.newcomer)
            if newcomer and any(newcomer in _read_status(node).get("peers", {}) for node in self.honest):
                self.first_seen = time.time()


def pulled_before_next_round(honest: list[NodeProc], since: float) -> dict:
    """Of the honest batches published after ``since`` (the publisher's last round left out), the share
    of (batch, honest receiver) pairs pulled before the publisher's next round began (exchange end + its
    training and weight sync: swarm_latency's measure)."""
    ids = {node.run_dir.name: _peer_id(node) for node in honest}
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
    peer = _peer_id(newcomer)
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


def _errors(node: NodeProc) -> list[str]:
    return [line for line in node.lines if any(marker in line for marker in ERROR_MARKERS)][:10]


def _status_summary(node: NodeProc) -> dict:
    status = _read_status(node)
    return {
        key: status.get(key) for key in ("roster_refused", "rejected", "fetch_failures", "notices", "dht")
    }


def _read_status(node: NodeProc) -> dict:
    try:
        return json.loads((node.run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _peer_id(node: NodeProc) -> str:
    return _read_status(node).get("peer_id", "")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------------------------------
# the attacker host (its own process)
# ---------------------------------------------------------------------------------------------------
async def _never_answer(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A silent holder: reads the pull request, then holds the stream open and says nothing."""
    with contextlib.suppress(Exception):
        await reader.readexactly(32)
        await asyncio.sleep(SILENT_HOLD_S)


def attack(work_dir: Path, swarm_id: str, initial: str, config: str, count: int) -> None:
    """One attacker host: ``count`` Sybil identities' cards and announcements, stored and notified,
    refreshed every REFRESH_S; prints ``READY {json}`` once its first flood is out."""
    from swarmnode.config import SwarmConfig, load_config
    from swarmnode.identity import Identity
    from swarmnode.swarm.net import dht
    from swarmnode.swarm.net.transport import Transport
    from swarmnode.swarm.wire import framing, work
    from swarmnode.tasks import TaskBank

    cfg = load_config(config)
    fingerprint = TaskBank(cfg.tasks, default_seed=0).fingerprint
    work_dir.mkdir(parents=True, exist_ok=True)
    Identity.generate().save(work_dir / "host.key")
    transport = Transport(
        work_dir / "host.key", SwarmConfig(swarm_id=swarm_id, initial_peers=[initial]), start_timeout_s=120.0
    )
    transport.serve(framing.PAYLOAD_STREAM, _never_answer)
    transport.start()
    sybils = {}  # peer id -> (identity, its proof of work at the swarm's bits)
    for _ in range(count):
        identity = Identity.generate()
        sybils[identity.peer_id] = (identity, work.mint(identity.public_key, cfg.swarm.identity_work_bits))
    sends = concurrent.futures.ThreadPoolExecutor(16)  # off the refresh's timer; records signed when sent
    jobs: dict[str, concurrent.futures.Future] = {}  # Sybil -> its flood job in flight (one at a time)
    started = time.monotonic()
    for refresh in range(int(HOST_LIFETIME_S / REFRESH_S)):
        honest = _honest_peers(dht.read_roster(transport.records, swarm_id, 10.0), swarm_id)
        done = [peer for peer, job in jobs.items() if job.done()]
        sent = sum(jobs.pop(peer).result() for peer in done)
        for peer, (identity, nonce) in sybils.items():
            if peer not in jobs:
                jobs[peer] = sends.submit(
                    _flood_one, transport, swarm_id, identity, nonce, fingerprint, honest, 1 + refresh
                )
        if refresh == 0:
            print("READY " + json.dumps({"identities": count, "honest": len(honest)}), flush=True)
        print("FLOOD " + json.dumps({"refresh": refresh, "sent": sent, "in_flight": len(jobs)}), flush=True)
        time.sleep(max(started + (refresh + 1) * REFRESH_S - time.monotonic(), 0.0))
    transport.shutdown()


def _honest_peers(cards: list[tuple[str, bytes]], swarm_id: str) -> list[str]:
    """The roster's peers that are not Sybils (any host's): whom the notices go to."""
    from swarmnode.swarm.wire import codec, limits

    honest = []
    for peer, record in cards:
        with contextlib.suppress(limits.ProtocolError):
            card, _ = codec.decode_message(record, swarm_id=swarm_id, expected_peer_id=peer)
            if card.model_name != "sybil":
                honest.append(peer)
    return honest


def _flood_one(
    transport, swarm_id: str, identity, nonce: bytes, fingerprint: str, honest: list[str], round_: int
) -> int:
    """One Sybil's fresh card and announcement: stored in the DHT and pushed to ``honest`` as notices
    (the card with them). How many of its records and notices were taken."""
    from swarmnode.swarm.exchange.compat import roster_extra
    from swarmnode.swarm.net import dht, notices
    from swarmnode.swarm.wire import codec, protocol

    now, seq = time.time(), int(time.time() * 1000)
    card = codec.encode_message(identity, swarm_id, protocol.RosterCard(
        peer_id=identity.peer_id, swarm_id=swarm_id, model_name="sybil", tokenizer_fingerprint="",
        policy_version=0, round=0, addrs=(), timestamp=now, seq=seq, extra=roster_extra(fingerprint),
        work_nonce=nonce,
    ))  # fmt: skip
    announcement = codec.encode_message(identity, swarm_id, protocol.BatchAnnouncement(
        peer_id=identity.peer_id, swarm_id=swarm_id, round=round_, policy_version=0,
        payload_sha256=os.urandom(32), payload_len=1024, n_groups=2, timestamp=now, seq=seq + 1,
    ))  # fmt: skip
    taken = 0
    sending = notices.notify(transport, honest, identity.peer_id, announcement, card)
    taken += _ok(dht.put_card, transport.records, swarm_id, identity.peer_id, card, 60.0, 10.0)
    taken += _ok(dht.put_announcement, transport.records, swarm_id, identity.peer_id, announcement, 10.0)
    with contextlib.suppress(Exception):
        taken += sending.result(timeout=10.0) if sending is not None else 0
    return taken


def _ok(call, *args) -> bool:
    try:
        return bool(call(*args))
    except Exception:  # noqa: BLE001 - a store that failed is counted as not taken
        return False


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
    problems += [f"{name}'s DHT process died" for name, alive in report["dht_alive"].items() if not alive]
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
