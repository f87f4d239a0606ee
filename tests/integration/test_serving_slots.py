"""Serving-slot exhaustion: 16 Sybil ids (their own process, tests/helpers/slot_hog.py) keep every stream
they may open at a node idle and re-open each one the node closes. A peer in good standing still pulls
every time (slots reserved for it), and so does a newcomer (idle streams are evicted for it)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

from swarmnode.config import SwarmConfig
from swarmnode.errors import PeerError
from swarmnode.experiment.processes import REPO, LineReader
from swarmnode.identity import Identity
from swarmnode.swarm.net.transport import Transport
from tests.helpers.swarm_procs import HELPERS, end_group

PULLS = 10
HOG_START_S = 180.0
PRESSURE_S = 3.0  # the Sybils re-open their streams for this long before the honest pulls start


def _transport(tmp_path, name: str, cfg: SwarmConfig) -> Transport:
    key = tmp_path / f"{name}.key"
    Identity.generate().save(key)
    return Transport(key, cfg)


def _pulls(puller: Transport, server: Transport, digest: bytes) -> tuple[int, list[str]]:
    ok, errors = 0, []
    for _ in range(PULLS):
        try:
            puller.fetch(server.peer_id, digest, timeout_s=5)
            ok += 1
        except PeerError as exc:
            errors.append(exc.reason)
    return ok, errors


def test_sybils_holding_idle_streams_do_not_starve_honest_pulls(tmp_path):
    nodes: list[Transport] = []
    hog = None
    try:
        server = _transport(tmp_path, "server", SwarmConfig())
        nodes.append(server)
        addrs = server.start()
        known = _transport(tmp_path, "known", SwarmConfig(initial_peers=addrs))
        nodes.append(known)
        known.start()
        newcomer = _transport(tmp_path, "newcomer", SwarmConfig(initial_peers=addrs))
        nodes.append(newcomer)
        newcomer.start()
        # the swarm: groups accepted, no strikes
        server.payloads.set_peer_standing(lambda peer: peer == known.peer_id)
        data = os.urandom(200_000)
        digest = hashlib.sha256(data).digest()
        server.payloads.offer(digest, data)

        hog = subprocess.Popen(
            [sys.executable, str(HELPERS / "slot_hog.py"), addrs[0], str(tmp_path / "sybils")],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own process group: the hog and its 16 p2pd
        )  # fmt: skip
        out = LineReader(hog.stdout)
        out.wait_for_line(lambda s: s.startswith("HOLDING "), HOG_START_S, lambda: "\n".join(out.lines))
        time.sleep(PRESSURE_S)

        known_ok, known_errors = _pulls(known, server, digest)
        newcomer_ok, newcomer_errors = _pulls(newcomer, server, digest)
        print(f"known {known_ok}/{PULLS} {known_errors}, newcomer {newcomer_ok}/{PULLS} {newcomer_errors}, "
              f"server {server.stats}")  # fmt: skip
        assert known_ok == PULLS, known_errors
        assert newcomer_ok >= PULLS // 2, newcomer_errors
        assert server.stats["refused"] + server.stats.get("evicted", 0) > 0  # the Sybils did hit the caps
    finally:
        if hog is not None:
            end_group(hog)
        for node in reversed(nodes):
            node.shutdown()
