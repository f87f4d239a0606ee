"""An honest round does not wait for a card that has never delivered (issue #26, acceptance 4).

Three real nodes in this process (hivemind DHTs and libp2p streams on 127.0.0.1): ``a`` and ``b`` publish
real scored groups every round; ``idle`` is up, its roster card is in every roster, and it never publishes
(the outside attacker's idle card: any such card made every honest round wait its full share deadline,
share phase 0.35-0.45 s -> 5 s). Peers without standing hold a round only while no live peer has
standing, and only until their first miss (exchange/roster.py ``to_wait_for``): from the second round on,
``a`` waits for ``b`` (standing: its groups were trained on, as a node's round credits them) and not for
``idle``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from benchmarks.harness.waiting import wait_until
from tests.helpers.inprocess_swarm import make_swarm
from tests.helpers.verify_world import Peer

SWARM = "it-idle-card"
DEADLINE_S = 5.0
ROUNDS = 4


@pytest.fixture
def trio(tmp_path):
    nodes = {}
    try:
        nodes["a"] = make_swarm(tmp_path, "a", [], SWARM, share_deadline_s=DEADLINE_S)
        addrs = nodes["a"].start()
        for name in ("b", "idle"):
            nodes[name] = make_swarm(tmp_path, name, addrs[:1], SWARM, share_deadline_s=DEADLINE_S)
            nodes[name].start()
        ids = {name: node.identity.peer_id for name, node in nodes.items()}
        for name, node in nodes.items():
            others = {pid for other, pid in ids.items() if other != name}
            assert wait_until(lambda n=node, o=others: n.service.refresh_roster() >= o, 60, 0.1), name
        yield nodes
    finally:
        for node in reversed(list(nodes.values())):
            node.shutdown()


def test_a_card_that_never_delivers_holds_no_round_after_its_first_miss(trio):
    a, b = trio["a"], trio["b"]
    senders = {node: Peer(node.identity, node.verifier.bank) for node in (a, b)}
    share_s = []
    for round_ in range(1, ROUNDS + 1):
        other = threading.Thread(target=b.exchange, args=(round_, 0, senders[b].groups()), daemon=True)
        other.start()
        started = time.monotonic()
        chosen = a.exchange(round_, 0, senders[a].groups())
        share_s.append(time.monotonic() - started)
        other.join(DEADLINE_S + 10)
        assert chosen, f"round {round_}: a trained on no group of b"
        a.credit_trained(Counter(g.provenance.producer for g in chosen))  # what a's round step reports
    print(f"\nshare phase per round with an idle card in the roster: {[round(s, 2) for s in share_s]}")
    assert trio["idle"].identity.peer_id in a.roster.live  # live all along: it only never delivered
    assert share_s[0] <= DEADLINE_S + 2.0  # round 1: nobody has standing yet, the idle card's one chance
    assert max(share_s[1:]) < 1.0, share_s
