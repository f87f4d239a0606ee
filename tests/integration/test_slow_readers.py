"""Slow readers (issue #26): 8 Sybil ids x 4 streams (their own process, tests/helpers/slow_readers.py) ask
a node for a 4 MiB payload and never read the answer, and open a new stream every 0.5 s: every slot open
to peers not in good standing is busy answering them. Before the answer deadline they held those 32 slots
for 30 s each and a newcomer's pulls were all refused; now a stream whose reader falls behind the minimum
rate is evicted for the newcomer, and each is aborted at its deadline."""

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
from swarmnode.swarm.net.payloads import SERVE_MAX_S
from swarmnode.swarm.net.transport import Transport
from tests.helpers.swarm_procs import HELPERS, end_group

PULLS = 10
PAYLOAD_BYTES = 4 * 1024 * 1024  # MAX_FRAME_BYTES: far more than a stream that is not read absorbs (~1 MB)
SYBILS = 8  # x 4 streams: the 32 slots open to any peer
HOG_START_S = 180.0
PRESSURE_S = 10.0  # every Sybil stream is answered, its reader stalled, before the honest pulls start


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


def test_sybils_that_ask_and_never_read_do_not_starve_a_newcomers_pulls(tmp_path):
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
        server.payloads.set_peer_standing(lambda peer: peer == known.peer_id)
        data = os.urandom(PAYLOAD_BYTES)
        digest = hashlib.sha256(data).digest()
        server.payloads.offer(digest, data)

        hog = subprocess.Popen(
            [sys.executable, str(HELPERS / "slow_readers.py"), addrs[0], str(tmp_path / "sybils"),
             digest.hex(), str(SYBILS)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own process group: the readers and their p2pd
        )  # fmt: skip
        out = LineReader(hog.stdout)
        out.wait_for_line(lambda s: s.startswith("HOLDING "), HOG_START_S, lambda: "\n".join(out.lines))
        time.sleep(PRESSURE_S)
        before = dict(server.stats)

        t = time.monotonic()
        newcomer_ok, newcomer_errors = _pulls(newcomer, server, digest)
        newcomer_s = time.monotonic() - t
        known_ok, known_errors = _pulls(known, server, digest)
        print(f"newcomer {newcomer_ok}/{PULLS} {newcomer_errors} in {newcomer_s:.1f} s, known {known_ok}/"
              f"{PULLS} {known_errors}; server before the pulls {before}, after {server.stats}")  # fmt: skip
        assert before["refused"] > 0  # the Sybils did fill their share
        assert known_ok == PULLS, known_errors
        assert newcomer_ok >= PULLS - 1, newcomer_errors
        # and a stream nobody evicted is aborted at its deadline (a 4 MiB answer: SERVE_MAX_S)
        deadline = time.monotonic() + SERVE_MAX_S + 5.0
        while server.stats["aborted"] == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert server.stats["aborted"] > 0, server.stats
    finally:
        if hog is not None:
            end_group(hog)
        for node in reversed(nodes):
            node.shutdown()
