"""The Sybil mix's hostile process: one process speaking for many identities of four kinds, each minted at
the swarm's identity work (``sybil_mix`` starts it; ``sybils``: what a host and a Sybil are).

    python -m benchmarks.reliability.mix_host WORK_DIR SWARM_ID INITIAL CONFIG CANNED SILENT FUTURE CHURN

- **canned**: publish valid batches of canned text whose claimed rewards are reasoning-gym's scores
  (``canned``): the cheapest route to standing the rules allow, since standing is earned by being trained
  on and a canned group carries signal;
- **future**: the same, with every timestamp (card, batch, announcement) signed LEAD_S ahead of the clock;
- **silent**: announce batches that do not exist (stored in the DHT and pushed as notices) and answer no
  pull;
- **churn**: every refresh each churn identity is replaced by a freshly minted one whose card is stored
  in the DHT: newcomers the honest nodes have never tried; some publish canned batches like the canned.

Two libp2p hosts in this one process: the *serving* host holds the canned, future and churn batches and
answers every pull of them; the *silent* host is the silent identities' holder and answers none. A holder
whose pull times out is backed off by the puller for every batch it holds, so silent identities sharing the
canned ones' holder would shield the honest nodes from the canned batches; the attacker keeps them apart.

Every REFRESH_S every identity's card is stored anew and the silent announcements too. An honest node takes
``notices.NOTICE_BURST`` notices at once from one sender (refilled at ``NOTICES_PER_MIN``), so each host
spends NOTICE_BUDGET notices per honest node a refresh, in turn across its identities (the serving host:
SERVED_SHARES of them to canned, future and churn). A served batch is announced by notice only: stored in
the DHT it would be found by a poll, whose only holder is its author (no address: unreachable), and given
up before the notice naming the serving host came. Notices and DHT stores run on lanes of their own
(``Lane``): on a loaded machine a store takes seconds, and notices queued behind them went out late or not
at all (a first run delivered a quarter of the notice budget).

Output: ``READY {json}`` once the first refresh is out, ``MIX {json}`` after each; ``identities.json`` in
WORK_DIR (rewritten each refresh): every identity's peer id by kind (churn: all ever minted) and the hosts'.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.reliability import sybils
from benchmarks.reliability.canned import Canned

KINDS = ("canned", "future", "silent", "churn")
REFRESH_S = 10.0  # every card and the silent announcements are stored again this often
HOST_LIFETIME_S = 900.0  # a host that is never ended stops by itself after this long
LEAD_S = 25.0  # the future-dated identities' lead (receivers accept up to limits.MAX_CLOCK_SKEW_S)
NOTICE_BUDGET = 16  # notices per honest node and host a refresh: notices.NOTICE_BURST
SERVED_SHARES = {"canned": 8, "future": 4, "churn": 4}  # of the serving host's NOTICE_BUDGET
SEND_WORKERS = 16  # per lane (notices; DHT stores), one job per identity in flight
SERVED_PAYLOADS = 4096  # batches the serving host keeps offered (the newest)
MAX_STORES_IN_FLIGHT = 512  # past it a refresh queues no churn card (a bounded backlog)


class Lane:
    """Jobs on their own workers, at most one per identity in flight: notices are never queued behind the
    DHT stores, which on a loaded machine take seconds each."""

    def __init__(self, workers: int):
        self._pool = concurrent.futures.ThreadPoolExecutor(workers)
        self._jobs: dict[str, concurrent.futures.Future] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def collect(self) -> int:
        """What the jobs that finished since the last call took (stores and notices); a job that raised
        took nothing and is said (``ERROR {json}``)."""
        taken = 0
        for key in [key for key, job in self._jobs.items() if job.done()]:
            job = self._jobs.pop(key)
            if job.exception() is None:
                taken += job.result()
            else:
                print("ERROR " + json.dumps({"identity": key, "error": repr(job.exception())}), flush=True)
        return taken

    def submit(self, key: str, job, *args) -> None:
        if key not in self._jobs:
            self._jobs[key] = self._pool.submit(job, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class MixHost:
    def __init__(self, work_dir: Path, swarm_id: str, initial: str, config: str, counts: dict[str, int]):
        from swarmnode.config import load_config
        from swarmnode.swarm.net.payloads import PayloadServer

        cfg = load_config(config)
        self.work_dir, self.swarm_id, self.bits = work_dir, swarm_id, cfg.swarm.identity_work_bits
        self.canned = Canned(cfg)
        self.counts = counts
        payloads = PayloadServer(payload_capacity=SERVED_PAYLOADS, max_streams_per_peer=16, max_streams=256)
        bits = self.bits
        self.serving = sybils.start_host(work_dir / "serving.key", swarm_id, initial, bits, payloads=payloads)
        self.silent = sybils.start_host(work_dir / "silent.key", swarm_id, initial, bits, silent=True)
        self.kinds = {
            "canned": sybils.mint(counts["canned"], bits),
            "future": sybils.mint(counts["future"], bits, lead_s=LEAD_S),
            "silent": sybils.mint(counts["silent"], bits),
            "churn": [],
        }
        self.churned: list[str] = []  # every churn identity ever minted
        self._turns = {kind: itertools.count() for kind in KINDS}  # whose turn it is for a notice
        self.notices, self.stores = Lane(SEND_WORKERS), Lane(SEND_WORKERS)

    def ours(self) -> set[str]:
        return {s.peer_id for kind in KINDS for s in self.kinds[kind]} | set(self.churned)

    def refresh(self, round_: int) -> dict:
        """One refresh (module docstring): what was taken since the last, and what is in flight."""
        fresh = sybils.mint(self.counts["churn"], self.bits)
        self.kinds["churn"] = fresh
        self.churned += [s.peer_id for s in fresh]
        honest = sybils.honest_peers(self.serving, self.swarm_id, self.ours())
        said = {"round": round_, "honest": len(honest), "notices_taken": self.notices.collect(),
                "stores_taken": self.stores.collect()}  # fmt: skip
        for kind in KINDS:
            noticed = self._take_turns(kind, SERVED_SHARES.get(kind, NOTICE_BUDGET))
            for sybil in self.kinds[kind]:
                if sybil.peer_id in noticed:
                    self.notices.submit(sybil.peer_id, self._notify, kind, sybil, honest, round_)
                if kind != "churn" or len(self.stores) < MAX_STORES_IN_FLIGHT:
                    self.stores.submit(sybil.peer_id, self._store, kind, sybil, round_)
        self._write_identities()
        return {**said, "notices_in_flight": len(self.notices), "stores_in_flight": len(self.stores)}

    def _take_turns(self, kind: str, n: int) -> set[str]:
        """The next ``n`` identities of ``kind`` in turn (churn: the fresh ones)."""
        members = self.kinds[kind]
        if not members:
            return set()
        return {members[next(self._turns[kind]) % len(members)].peer_id for _ in range(min(n, len(members)))}

    def card(self, sybil: sybils.Sybil) -> bytes:
        """A card signed now: a job queued behind others signs when it runs, so its card is never stale."""
        return sybil.card(self.swarm_id, self.canned.fingerprint, self.canned.model_name)

    def _notify(self, kind: str, sybil: sybils.Sybil, honest: list[str], round_: int) -> int:
        """A notice of a new batch of ``sybil`` (with its card) to every honest peer. A silent identity's
        batch does not exist; the others' is offered on the serving host first."""
        from swarmnode.swarm.wire import limits

        card = self.card(sybil)
        if kind == "silent":
            announcement = sybil.announcement(self.swarm_id, round_, os.urandom(32), 1024, 2)
            host = self.silent
        else:
            data, announcement = self.canned.batch(sybil, self.swarm_id, round_)
            self.serving.payloads.offer(limits.payload_digest(data), data)
            host = self.serving
        return sybils.send(host, self.swarm_id, sybil, card, announcement=announcement, notify=honest,
                           store_card=False, store_announcement=False)  # fmt: skip

    def _store(self, kind: str, sybil: sybils.Sybil, round_: int) -> int:
        """``sybil``'s card in the DHT; a silent identity's announcement too (a served batch is announced by
        notice alone: module docstring)."""
        card = self.card(sybil)
        if kind == "silent":
            announcement = sybil.announcement(self.swarm_id, round_, os.urandom(32), 1024, 2)
            return sybils.send(self.silent, self.swarm_id, sybil, card, announcement=announcement)
        return sybils.send(self.serving, self.swarm_id, sybil, card)

    def _write_identities(self) -> None:
        identities = {kind: [s.peer_id for s in self.kinds[kind]] for kind in ("canned", "future", "silent")}
        identities["churn"] = list(self.churned)
        identities["hosts"] = {"serving": self.serving.peer_id, "silent": self.silent.peer_id}
        path = self.work_dir / "identities.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(identities))
        tmp.replace(path)

    def shutdown(self) -> None:
        self.notices.shutdown()
        self.stores.shutdown()
        self.serving.shutdown()
        self.silent.shutdown()


def main(argv: list[str]) -> None:
    work_dir, swarm_id, initial, config = Path(argv[0]), argv[1], argv[2], argv[3]
    counts = dict(zip(KINDS, map(int, argv[4:8]), strict=True))
    host = MixHost(work_dir, swarm_id, initial, config, counts)
    try:
        started = time.monotonic()
        for refresh in range(int(HOST_LIFETIME_S / REFRESH_S)):
            said = host.refresh(1 + refresh)
            if refresh == 0:
                ready = {**counts, "identities": sum(counts.values()), **said}
                print("READY " + json.dumps(ready), flush=True)
            print("MIX " + json.dumps(said), flush=True)
            time.sleep(max(started + (refresh + 1) * REFRESH_S - time.monotonic(), 0.0))
    finally:
        host.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
