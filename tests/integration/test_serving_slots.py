"""Serving-slot exhaustion: 16 Sybil ids (their own process, tests/helpers/slot_hog.py) keep every stream
they may open at a node idle and re-open each one the node closes. A peer in good standing still pulls
every time (slots reserved for it), and so does a newcomer (idle streams are evicted for it)."""

from __future__ import annotations

from swarmnode.swarm.net.transport import Transport
from tests.helpers.serving import PULLS, pulls, start_serving, start_sybils
from tests.helpers.swarm_procs import end_group

PRESSURE_S = 3.0  # the Sybils re-open their streams for this long before the honest pulls start


def test_sybils_holding_idle_streams_do_not_starve_honest_pulls(tmp_path):
    nodes: list[Transport] = []
    hog = None
    try:
        serving = start_serving(tmp_path, nodes, 200_000)
        server = serving.server
        hog = start_sybils("slot_hog.py", serving.addrs[0], str(tmp_path / "sybils"), pressure_s=PRESSURE_S)

        known_ok, known_errors = pulls(serving.known, serving)
        newcomer_ok, newcomer_errors = pulls(serving.newcomer, serving)
        print(f"known {known_ok}/{PULLS} {known_errors}, newcomer {newcomer_ok}/{PULLS} {newcomer_errors}, "
              f"server {server.counts().serving}")  # fmt: skip
        assert known_ok == PULLS, known_errors
        assert newcomer_ok >= PULLS // 2, newcomer_errors
        serving = server.counts().serving
        assert serving.refused + serving.evicted > 0  # the Sybils did hit the caps
    finally:
        if hog is not None:
            end_group(hog)
        for node in reversed(nodes):
            node.shutdown()
