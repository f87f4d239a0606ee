"""A hostile DHT peer (its own process, a bare hivemind DHT) against two honest swarm nodes on 127.0.0.1.

It pins the victim's subkeys with far-future garbage, stores a plain value over its announcement key,
spams 100 KB subkeys past hivemind's 4 MiB answer cap, and floods the roster with 1000 signed Sybil cards
dated 2100 (tests/helpers/dht_attacker.py). The honest nodes must keep exchanging: the reader sees the
victim, only the victim, and pulls its batch.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

from swarmnode.config import NodeConfig
from swarmnode.identity import Identity
from swarmnode.swarm.exchange import Swarm
from swarmnode.tasks import TaskBank
from tests.helpers.swarm_procs import HELPERS, REPO, LineReader
from tests.helpers.verify_world import Peer

SWARM = "dht-hostile"
ATTACK_TIMEOUT_S = 180.0


def _node(tmp_path, name: str, initial_peers: list[str]) -> Swarm:
    identity = Identity.generate()
    key = tmp_path / f"{name}.key"
    identity.save(key)
    cfg = NodeConfig.model_validate(
        {
            "swarm": {"swarm_id": SWARM, "initial_peers": initial_peers, "share_deadline_s": 10},
            "tasks": {"mix": {"basic_arithmetic": {}}, "seed": 1},
        }
    )
    run_dir = tmp_path / name
    run_dir.mkdir()
    policy = SimpleNamespace(name="tiny-llama", tokenizer_fingerprint="ab" * 32, tokenizer=range(512))
    bank = TaskBank(cfg.tasks, default_seed=0)
    return Swarm(cfg, identity=identity, bank=bank, policy=policy, identity_path=key, run_dir=run_dir)


def test_pinning_spam_and_a_sybil_flood_leave_the_honest_exchange_intact(tmp_path):
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
            [*cmd, "pin", "spam", "sybil"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out = LineReader(attacker.stdout)
        line = out.wait_for_line(
            lambda s: s.startswith("STORED "), ATTACK_TIMEOUT_S, lambda: "\n".join(out.lines)
        )
        stored = json.loads(line.removeprefix("STORED "))
        print("attacker stores accepted by some node:", stored)

        # the victim publishes after the attack, as it does every round
        groups = Peer(victim.identity, victim.verifier.bank).groups(2)
        victim.publish_roster(1, 0)
        victim.publish(1, 0, groups)

        assert reader._live_peers() == {victim.identity.peer_id}
        assert set(reader.roster) == {victim.identity.peer_id}  # no Sybil card, dated 2100 or not
        reader.poll(1, time.monotonic() + 10.0)
        assert reader.counters.groups_accepted == len(groups), reader.status(1, 0)
        assert stored.get("pin", 0) == 0 and stored.get("sybil", 0) == 0, stored  # no honest node took them
    finally:
        if attacker is not None:
            attacker.send_signal(signal.SIGKILL)  # the process this test started, by PID
            with contextlib.suppress(subprocess.TimeoutExpired):
                attacker.wait(timeout=10)
        for node in reversed(nodes):
            node.shutdown()
