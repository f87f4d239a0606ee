"""A real Swarm (hivemind DHT on 127.0.0.1, real Verifier and TaskBank) built in the test's process: for
tests that drive the announcer or the exchange directly instead of through a `swarmnode join` process."""

from __future__ import annotations

from types import SimpleNamespace

from swarmnode.config import NodeConfig
from swarmnode.identity import Identity
from swarmnode.swarm.exchange.swarm import Swarm
from swarmnode.swarm.wire import work
from swarmnode.tasks import TaskBank


def make_swarm(
    tmp_path, name: str, initial_peers: list[str], swarm_id: str, share_deadline_s: float = 10
) -> Swarm:
    """An unstarted Swarm with its own identity and run folder under ``tmp_path / name``; the policy is a
    stand-in with a name, a tokenizer fingerprint and a vocabulary size (nothing samples or trains)."""
    identity = Identity.generate()
    key = tmp_path / f"{name}.key"
    identity.save(key)
    cfg = NodeConfig.model_validate(
        {
            "swarm": {
                "swarm_id": swarm_id,
                "initial_peers": initial_peers,
                "share_deadline_s": share_deadline_s,
            },
            "tasks": {"mix": {"basic_arithmetic": {}}, "seed": 1},
        }
    )
    run_dir = tmp_path / name
    run_dir.mkdir()
    policy = SimpleNamespace(name="tiny-llama", tokenizer_fingerprint="ab" * 32, tokenizer=range(512))
    bank = TaskBank(cfg.tasks, default_seed=0)
    nonce = work.mint(identity.public_key, cfg.swarm.identity_work_bits)
    return Swarm(
        cfg, identity=identity, bank=bank, policy=policy, identity_path=key, run_dir=run_dir, work_nonce=nonce
    )
