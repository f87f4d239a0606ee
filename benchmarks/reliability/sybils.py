"""Sybil identities and the libp2p hosts that speak for them: what the Sybil studies' attacker processes
(``sybil_flood``, ``mix_host``) share.

A *host* is a real ``Transport`` in the swarm's DHT (``start_host``); its DHT node asks the swarm's
identity work of the cards stored with it, as every honest node does (with a stricter rule it would
refuse the honest cards, and which attackers the honest nodes hear of would depend on DHT ids). A *Sybil*
is an identity minted at that work (``mint``) whose roster cards and batch announcements the host signs,
stores in the DHT and pushes as notices from its own libp2p identity: the *holder*, the only peer an
honest node can pull the Sybil's batches from (a Sybil has no host, no address of its own). A Sybil
minted with ``lead_s`` signs every timestamp that far ahead of the clock (a future-dated one).

A silent host (``start_host(..., silent=True)``) accepts every pull stream, reads the request and never
answers (SILENT_HOLD_S). The driver side: ``spawn_host`` starts an attacker process (``python -m
<module> ARGS``), which says ``READY {json}`` once its first records are out and ``KIND {json}`` lines as
it goes (``HostProc.said``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness.processes import REPO, LineReader, node_env

SYBIL_MODEL = "sybil"  # the model name on the cards of Sybils that do not pretend to run one
SILENT_HOLD_S = 60.0  # a silent host holds a pull stream open, unanswered, this long
START_TIMEOUT_S = 120.0  # a loaded machine can take a while to start a host's DHT and p2pd
CARD_TTL_S = 60.0  # a Sybil card's DHT lifetime (the hosts refresh far more often)
READY_TIMEOUT_S = 300.0  # an attacker process's start, first records included
STORE_TIMEOUT_S = 10.0  # one DHT store or roster read
NOTICE_TIMEOUT_S = 10.0  # one round of notices to the honest peers


@dataclass
class Sybil:
    """One Sybil identity with its proof of work; signs with timestamps ``lead_s`` ahead of the clock."""

    identity: object  # swarmnode.identity.Identity
    nonce: bytes
    lead_s: float = 0.0
    _seq: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # stamps from several threads

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def stamp(self) -> tuple[int, float]:
        """(seq, timestamp) for its next signed message: both increasing; the timestamp ``lead_s`` ahead."""
        with self._lock:
            timestamp = time.time() + self.lead_s
            self._seq = max(self._seq + 1, int(timestamp * 1000))
            return self._seq, timestamp

    def card(self, swarm_id: str, fingerprint: str, model_name: str = SYBIL_MODEL) -> bytes:
        """A fresh signed roster card carrying its work and the swarm's task fingerprint (so it is pulled)."""
        from swarmnode.swarm.exchange.compat import roster_extra
        from swarmnode.swarm.wire import codec, protocol

        seq, timestamp = self.stamp()
        return codec.encode_message(self.identity, swarm_id, protocol.RosterCard(
            peer_id=self.peer_id, swarm_id=swarm_id, model_name=model_name, tokenizer_fingerprint="",
            policy_version=0, round=0, addrs=(), timestamp=timestamp, seq=seq,
            extra=roster_extra(fingerprint), work_nonce=self.nonce,
        ))  # fmt: skip

    def announcement(self, swarm_id: str, round_: int, digest: bytes, length: int, n_groups: int) -> bytes:
        """A signed announcement of the payload ``digest`` (which may not exist)."""
        from swarmnode.swarm.wire import codec, protocol

        seq, timestamp = self.stamp()
        return codec.encode_message(self.identity, swarm_id, protocol.BatchAnnouncement(
            peer_id=self.peer_id, swarm_id=swarm_id, round=round_, policy_version=0, payload_sha256=digest,
            payload_len=length, n_groups=n_groups, timestamp=timestamp, seq=seq, work_nonce=self.nonce,
        ))  # fmt: skip


def mint(count: int, bits: int, lead_s: float = 0.0) -> list[Sybil]:
    """``count`` fresh identities, each with its proof of ``bits`` bits of work."""
    from swarmnode.identity import Identity
    from swarmnode.swarm.wire import work

    sybils = []
    for _ in range(count):
        identity = Identity.generate()
        sybils.append(Sybil(identity, work.mint(identity.public_key, bits), lead_s))
    return sybils


async def _never_answer(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A silent holder: reads the pull request, then holds the stream open and says nothing."""
    with contextlib.suppress(Exception):
        await reader.readexactly(32)
        await asyncio.sleep(SILENT_HOLD_S)


def start_host(
    key_path: Path, swarm_id: str, initial: str, bits: int, *, payloads=None, silent: bool = False
):
    """A started host with a fresh key at ``key_path``, in the swarm through ``initial`` (a multiaddr);
    ``payloads`` (a ``PayloadServer``) serves what is offered on it, ``silent`` answers no pull."""
    from swarmnode.config import SwarmConfig
    from swarmnode.identity import Identity
    from swarmnode.swarm.net.transport import Transport
    from swarmnode.swarm.wire import framing

    key_path.parent.mkdir(parents=True, exist_ok=True)
    Identity.generate().save(key_path)
    config = SwarmConfig(swarm_id=swarm_id, initial_peers=[initial], identity_work_bits=bits)
    transport = Transport(key_path, config, payloads=payloads, start_timeout_s=START_TIMEOUT_S)
    if silent:
        transport.serve(framing.PAYLOAD_STREAM, _never_answer)
    transport.start()
    return transport


def honest_peers(transport, swarm_id: str, ours: set[str]) -> list[str]:
    """The roster's peers (read from the DHT) that are no Sybil: not in ``ours`` and not carrying
    SYBIL_MODEL (another host's). Whom the notices go to."""
    from swarmnode.swarm.net import dht
    from swarmnode.swarm.wire import codec, limits

    honest = []
    for peer, record in dht.read_roster(transport.records, swarm_id, STORE_TIMEOUT_S):
        with contextlib.suppress(limits.ProtocolError):
            card, _ = codec.decode_message(record, swarm_id=swarm_id, expected_peer_id=peer)
            if card.model_name != SYBIL_MODEL and peer not in ours:
                honest.append(peer)
    return honest


def send(
    transport,
    swarm_id: str,
    sybil: Sybil,
    card: bytes,
    *,
    announcement: bytes | None = None,
    notify: list[str] = (),
    store_card: bool = True,
    store_announcement: bool = True,
) -> int:
    """Push ``sybil``'s ``announcement`` (if any) with its ``card`` as a notice to the ``notify`` peers, and
    meanwhile store the card (``store_card``) and the announcement (``store_announcement``) in the DHT.
    How many stores and notices were taken; never raises."""
    from swarmnode.swarm.net import dht, notices

    sending = None
    if announcement is not None and notify:
        sending = notices.notify(transport, list(notify), sybil.peer_id, announcement, card)
    records, taken = transport.records, 0
    if store_card:
        taken += _ok(dht.put_card, records, swarm_id, sybil.peer_id, card, CARD_TTL_S, STORE_TIMEOUT_S)
    if announcement is not None and store_announcement:
        taken += _ok(dht.put_announcement, records, swarm_id, sybil.peer_id, announcement, STORE_TIMEOUT_S)
    with contextlib.suppress(Exception):
        taken += sending.result(timeout=NOTICE_TIMEOUT_S) if sending is not None else 0
    return taken


def _ok(call, *args) -> bool:
    try:
        return bool(call(*args))
    except Exception:  # noqa: BLE001 - a store that failed is counted as not taken
        return False


@dataclass
class HostProc:
    """An attacker process this driver started (``spawn_host``), its output collected."""

    proc: subprocess.Popen
    reader: LineReader
    log: Path

    def ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict:
        """Wait (bounded) for its ``READY {json}`` line; returns the json."""
        line = self.reader.wait_for_line(
            lambda line: line.startswith("READY "), timeout_s, lambda: "\n".join(self.reader.lines[-20:])
        )
        return json.loads(line.split(" ", 1)[1])

    def said(self, kind: str) -> list[dict]:
        """The json of every ``KIND {json}`` line it printed."""
        lines = [line for line in self.reader.lines if line.startswith(kind + " ")]
        return [json.loads(line.split(" ", 1)[1]) for line in lines]

    def stop(self) -> None:
        """Kill it (ours, by PID) and keep its output in ``log``."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text("\n".join(self.reader.lines) + "\n")


def spawn_host(module: str, work_dir: Path, *args: object) -> HostProc:
    """``python -m module work_dir *args`` from the repository root; its output goes to
    ``work_dir/attacker.log`` when it is stopped."""
    cmd = [sys.executable, "-m", module, str(work_dir), *map(str, args)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=node_env()
    )
    return HostProc(proc, LineReader(proc.stdout), work_dir / "attacker.log")
