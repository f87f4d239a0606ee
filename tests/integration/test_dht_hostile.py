"""A hostile DHT peer (its own process, a bare hivemind DHT) against two honest swarm nodes on 127.0.0.1.

It pins the victim's subkeys with far-future garbage, stores a plain value over its announcement key,
spams 100 KB subkeys past hivemind's 4 MiB answer cap, and floods the roster with 1000 signed Sybil cards
dated 2100 (tests/helpers/dht_attacker.py). The honest nodes must keep exchanging: the reader sees the
victim, only the victim, and pulls its batch. The default suite runs the pinning alone (seconds); the
full set, ~3 min on a loaded machine, is marked slow.

A digest squatter (tests/helpers/squatter.py, its own process) re-announces the victim's payload digest
under its own key and answers "not found": the reader still pulls the victim's batch and charges the
squatter half a strike.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.harness.processes import REPO, LineReader
from benchmarks.harness.waiting import wait_until
from swarmnode.swarm.exchange.swarm import Swarm
from tests.helpers.inprocess_swarm import make_swarm
from tests.helpers.swarm_procs import HELPERS, end_group
from tests.helpers.verify_world import Peer

SWARM = "dht-hostile"
ATTACK_TIMEOUT_S = 180.0


def _node(tmp_path, name: str, initial_peers: list[str]) -> Swarm:
    return make_swarm(tmp_path, name, initial_peers, SWARM)


def test_pinning_leaves_the_honest_exchange_intact(tmp_path):
    _attacked_exchange(tmp_path, ["pin"])


@pytest.mark.slow
def test_pinning_spam_and_a_sybil_flood_leave_the_honest_exchange_intact(tmp_path):
    _attacked_exchange(tmp_path, ["pin", "spam", "sybil"])


def _attacked_exchange(tmp_path, attacks: list[str]) -> None:
    nodes: list[Swarm] = []
    attacker = None
    try:
        reader = _node(tmp_path, "reader", [])
        nodes.append(reader)
        address = reader.start()[0]
        victim = _node(tmp_path, "victim", [address])
        nodes.append(victim)
        victim.start()

        cmd = [sys.executable, str(HELPERS / "dht_attacker.py"), address, SWARM, victim.identity.peer_id]
        attacker = subprocess.Popen(
            [*cmd, *attacks],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: it, its bare DHT process and p2pd
        )
        out = LineReader(attacker.stdout)
        line = out.wait_for_line(
            lambda s: s.startswith("STORED "), ATTACK_TIMEOUT_S, lambda: "\n".join(out.lines)
        )
        stored = json.loads(line.removeprefix("STORED "))
        print("attacker stores accepted by some node:", stored)

        # the victim publishes after the attack, as it does every round
        groups = Peer(victim.identity, victim.verifier.bank).groups(2)
        victim.announcer.set_progress(1, 0)
        victim.announcer.announce()
        victim.publish(1, 0, groups)

        assert reader.service.refresh_roster() == {victim.identity.peer_id}
        assert set(reader.roster.cards) == {victim.identity.peer_id}  # no Sybil card, dated 2100 or not
        # the reader's background service pulls it (notice or poll) without an exchange running
        accepted = lambda: reader.arrivals.snapshot().counters.groups_accepted == len(groups)  # noqa: E731
        assert wait_until(accepted, 20, 0.5), f"not pulled: {reader.status(1, 0)}"
        assert stored.get("pin", 0) == 0 and stored.get("sybil", 0) == 0, stored  # no honest node took them
    finally:
        if attacker is not None:
            end_group(attacker)
        for node in reversed(nodes):
            node.shutdown()


def test_a_digest_squatter_neither_hides_the_honest_batch_nor_goes_uncharged(tmp_path):
    nodes: list[Swarm] = []
    squatter = None
    try:
        reader = _node(tmp_path, "reader", [])
        nodes.append(reader)
        address = reader.start()[0]
        victim = _node(tmp_path, "victim", [address])
        nodes.append(victim)
        cmd = [sys.executable, str(HELPERS / "squatter.py"), address, SWARM, victim.identity.peer_id,
               str(tmp_path / "squatter")]  # fmt: skip
        squatter = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        out = LineReader(squatter.stdout)
        describe = lambda: "\n".join(out.lines)  # noqa: E731
        sybil = json.loads(
            out.wait_for_line(lambda s: s.startswith("READY "), ATTACK_TIMEOUT_S, describe)[6:]
        )
        sybil = sybil["peer_id"]
        # the squatter enters the reader's roster first, so its announcement is pulled first: the order in
        # which keying pulled payloads by digest alone hid the victim's batch for good
        assert wait_until(lambda: sybil in reader.service.refresh_roster(), 60, 0.5), (
            "the squatter never reached the roster"
        )
        victim.start()
        assert wait_until(lambda: victim.identity.peer_id in reader.service.refresh_roster(), 60, 0.5), (
            "the victim never reached the roster"
        )
        assert list(reader.roster.cards) == [sybil, victim.identity.peer_id]

        groups = Peer(victim.identity, victim.verifier.bank).groups(2)
        victim.publish(1, 0, groups)
        out.wait_for_line(lambda s: s.startswith("SQUATTED "), ATTACK_TIMEOUT_S, describe)
        accepted = lambda: reader.arrivals.snapshot().counters.groups_accepted == len(groups)  # noqa: E731
        assert wait_until(accepted, 20, 0.5), f"not pulled: {reader.status(1, 0)}"
        # The victim's notice usually brings its batch before the squatter's copy of the announcement is
        # read; a squatted announcement pulled before that answers "not found" and is charged.
        squatted_pulls = reader.arrivals.snapshot().counters.fetch_failures.get("not_found", 0)
        assert squatted_pulls <= 1, reader.status(1, 0)
        assert (reader.book.reputation(sybil) < 0) == (squatted_pulls == 1)  # half a strike each
    finally:
        if squatter is not None:
            end_group(squatter)
        for node in reversed(nodes):
            node.shutdown()
