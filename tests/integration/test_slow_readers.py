"""Slow readers (issue #26): 8 Sybil ids x 4 streams (their own process, tests/helpers/slow_readers.py) ask
a node for a 4 MiB payload and never read the answer, and open a new stream every 0.5 s: every slot open
to peers not in good standing is busy answering them. Before the answer deadline they held those 32 slots
for 30 s each and a newcomer's pulls were all refused; now a stream whose reader falls behind the minimum
rate is evicted for the newcomer, and each is aborted at its deadline."""

from __future__ import annotations

import time

from swarmnode.swarm.net.payloads import SERVE_MAX_S
from swarmnode.swarm.net.transport import Transport
from tests.helpers.serving import PULLS, pulls, start_serving, start_sybils
from tests.helpers.swarm_procs import end_group

PAYLOAD_BYTES = 4 * 1024 * 1024  # MAX_FRAME_BYTES: far more than a stream that is not read absorbs (~1 MB)
SYBILS = 8  # x 4 streams: the 32 slots open to any peer
PRESSURE_S = 10.0  # every Sybil stream is answered, its reader stalled, before the honest pulls start


def test_sybils_that_ask_and_never_read_do_not_starve_a_newcomers_pulls(tmp_path):
    nodes: list[Transport] = []
    hog = None
    try:
        serving = start_serving(tmp_path, nodes, PAYLOAD_BYTES)
        server = serving.server
        hog = start_sybils(
            "slow_readers.py", serving.addrs[0], str(tmp_path / "sybils"), serving.digest.hex(), str(SYBILS),
            pressure_s=PRESSURE_S,
        )  # fmt: skip
        before = server.counts().serving

        t = time.monotonic()
        newcomer_ok, newcomer_errors = pulls(serving.newcomer, serving)
        newcomer_s = time.monotonic() - t
        known_ok, known_errors = pulls(serving.known, serving)
        after = server.counts().serving
        print(f"newcomer {newcomer_ok}/{PULLS} {newcomer_errors} in {newcomer_s:.1f} s, known {known_ok}/"
              f"{PULLS} {known_errors}; server before the pulls {before}, after {after}")  # fmt: skip
        assert before.refused > 0  # the Sybils did fill their share
        assert known_ok == PULLS, known_errors
        assert newcomer_ok >= PULLS - 1, newcomer_errors
        # and a stream nobody evicted is aborted at its deadline (a 4 MiB answer: SERVE_MAX_S)
        deadline = time.monotonic() + SERVE_MAX_S + 5.0
        while server.counts().serving.aborted == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert server.counts().serving.aborted > 0, server.counts().serving
    finally:
        if hog is not None:
            end_group(hog)
        for node in reversed(nodes):
            node.shutdown()
