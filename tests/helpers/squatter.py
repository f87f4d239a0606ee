"""A digest squatter in its own process (test_dht_hostile.py): it joins the swarm like any node (a real
hivemind Transport, a roster card with the honest task fingerprint so that readers pull from it), watches the
victim's announcement key, and re-announces every payload digest the victim announces under its own key and
signature. It never holds the payload: a reader that pulls from it gets "not found".

    python tests/helpers/squatter.py <initial peer multiaddr> <swarm id> <victim peer id> <work dir>

Prints ``READY {"peer_id": ...}`` once its card is stored, ``SQUATTED {"digest": hex}`` after each
re-announcement; runs until the test kills it by PID.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from swarmnode.config import NodeConfig, SwarmConfig
from swarmnode.identity import Identity
from swarmnode.swarm.exchange.compat import roster_extra
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire import codec, dht_rules, limits, protocol, work
from swarmnode.tasks import TaskBank

TTL_S = 60.0
POLL_S = 0.2
MIX = {"basic_arithmetic": {}}  # test_dht_hostile's nodes' mix and seed: the same task fingerprint
SEED = 1


def main() -> None:
    initial, swarm, victim, work_dir = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    work_dir.mkdir(parents=True, exist_ok=True)
    identity = Identity.generate()
    key = work_dir / "squatter.key"
    identity.save(key)
    transport = Transport(key, SwarmConfig(swarm_id=swarm, initial_peers=[initial]), start_timeout_s=120.0)
    addrs = transport.start()
    bank = TaskBank(NodeConfig.model_validate({"tasks": {"mix": MIX, "seed": SEED}}).tasks, default_seed=0)
    seq = int(time.time() * 1000)
    card = protocol.RosterCard(
        peer_id=identity.peer_id, swarm_id=swarm, model_name="tiny-llama", tokenizer_fingerprint="ab" * 32,
        policy_version=0, round=0, addrs=tuple(addrs[: limits.MAX_ADDRS]), timestamp=time.time(), seq=seq,
        extra=roster_extra(bank.fingerprint),
        work_nonce=work.mint(identity.public_key, NodeConfig().swarm.identity_work_bits),  # the victims' bits
    )  # fmt: skip
    record = codec.encode_message(identity, swarm, card)
    transport.records.put(dht_rules.roster_key(swarm, identity.peer_id), identity.peer_id, record, TTL_S)
    print("READY " + json.dumps({"peer_id": identity.peer_id}), flush=True)
    squatted: set[bytes] = set()
    while True:
        found = transport.records.get(dht_rules.announce_key(swarm, victim)).get(victim)
        if found is not None:
            theirs, _ = codec.decode_message(found, swarm_id=swarm, expected_peer_id=victim)
            if theirs.payload_sha256 not in squatted:
                seq += 1
                ours = protocol.BatchAnnouncement(
                    peer_id=identity.peer_id, swarm_id=swarm, round=theirs.round,
                    policy_version=theirs.policy_version, payload_sha256=theirs.payload_sha256,
                    payload_len=theirs.payload_len, n_groups=theirs.n_groups, timestamp=time.time(), seq=seq,
                )  # fmt: skip
                record = codec.encode_message(identity, swarm, ours)
                key_ = dht_rules.announce_key(swarm, identity.peer_id)
                if transport.records.put(key_, identity.peer_id, record, TTL_S):
                    squatted.add(theirs.payload_sha256)
                    print("SQUATTED " + json.dumps({"digest": theirs.payload_sha256.hex()}), flush=True)
        time.sleep(POLL_S)


if __name__ == "__main__":
    main()
