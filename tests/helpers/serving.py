"""A node serving a payload to a peer in good standing and to a newcomer, while Sybils in their own
process (tests/helpers/slot_hog.py, slow_readers.py) press on its serving slots: the set-up that
test_serving_slots.py and test_slow_readers.py share."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from benchmarks.harness.processes import REPO, LineReader
from swarmnode.config import SwarmConfig
from swarmnode.errors import PeerError
from swarmnode.identity import Identity
from swarmnode.swarm.net.transport import Transport
from tests.helpers.swarm_procs import HELPERS

PULLS = 10
HOG_START_S = 180.0


@dataclass
class Serving:
    server: Transport
    known: Transport  # a peer in good standing at the server
    newcomer: Transport
    addrs: list[str]  # the server's
    digest: bytes  # of the payload the server offers


def start_serving(tmp_path, nodes: list[Transport], payload_bytes: int) -> Serving:
    """Start the server, a known peer and a newcomer (each appended to ``nodes`` for the caller to shut
    down); the server offers ``payload_bytes`` random bytes."""

    def transport(name: str, cfg: SwarmConfig) -> Transport:
        key = tmp_path / f"{name}.key"
        Identity.generate().save(key)
        node = Transport(key, cfg)
        nodes.append(node)
        return node

    server = transport("server", SwarmConfig())
    addrs = server.start()
    known = transport("known", SwarmConfig(initial_peers=addrs))
    known.start()
    newcomer = transport("newcomer", SwarmConfig(initial_peers=addrs))
    newcomer.start()
    server.payloads.set_peer_standing(lambda peer: peer == known.peer_id)  # groups accepted, no strikes
    data = os.urandom(payload_bytes)
    digest = hashlib.sha256(data).digest()
    server.payloads.offer(digest, data)
    return Serving(server, known, newcomer, addrs, digest)


def start_sybils(script: str, *args: str, pressure_s: float) -> subprocess.Popen:
    """Run a Sybil helper of tests/helpers/ in its own process group (it and its p2pd), wait for it to
    hold its streams, then ``pressure_s`` more."""
    hog = subprocess.Popen(
        [sys.executable, str(HELPERS / script), *args], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    out = LineReader(hog.stdout)
    out.wait_for_line(lambda s: s.startswith("HOLDING "), HOG_START_S, lambda: "\n".join(out.lines))
    time.sleep(pressure_s)
    return hog


def pulls(puller: Transport, serving: Serving) -> tuple[int, list[str]]:
    """PULLS pulls of the offered payload: how many succeeded, and the failures' reasons."""
    ok, errors = 0, []
    for _ in range(PULLS):
        try:
            puller.fetch(serving.server.peer_id, serving.digest, timeout_s=5)
            ok += 1
        except PeerError as exc:
            errors.append(exc.reason)
    return ok, errors
