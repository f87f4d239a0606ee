"""A run folder describes itself: the effective config is saved in it, and what reads the folder later
(a restart, ``eval``, ``export``, ``config show``) starts from that config instead of the defaults.

Precedence for a folder that holds a run: defaults < the saved ``config.yaml`` < ``--config`` YAML <
``--set``. A forgotten ``--set`` on a restart is therefore harmless; a restart that asks for a different
value than the run was started with is a conflict, named field by field, unless ``--reconfigure`` is
given. Some fields may differ on every start (how long to run, where to listen, whom to dial, which swarm
to train with); the model never may, because the checkpoints hold its weights. A folder whose start never
completed a round (it failed or was stopped before one) holds no run yet: a corrected retry starts afresh.

A swarm node's folder also remembers where it was in the network (``known_peers.json``: its listen port
and up to ``MAX_KNOWN_PEERS`` peers' addresses), so that a restart with the same command finds its swarm
again instead of founding a new one on a new port (``join.rejoin_network`` reads it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from swarmnode.common import atomic_write, log
from swarmnode.config import NodeConfig, load_config
from swarmnode.errors import ConfigError
from swarmnode.runlog import RunLog

CONFIG_FILE = "config.yaml"
# Dotted prefixes a start may change freely: the run's length and place, and the network's addresses.
FREE_ON_RESTART = (
    "run.rounds",
    "run.run_dir",
    "run.resume",
    "run.metrics_host",
    "run.metrics_port",
    "run.cpu_threads",
    "run.tensorboard",
    "swarm.swarm_id",  # the wrong-swarm hint's "--set swarm.swarm_id=X" must work as printed
    "swarm.initial_peers",
    "swarm.host_maddrs",
    "swarm.announce_maddrs",
    "swarm.reachability",
    "swarm.min_peers",
    "swarm.wait_for_peers_s",
    "bootstrap",
    "probe",  # measures the policy, never changes it
)
FIXED_ON_RESTART = ("model",)  # the checkpoints hold weights of this model: no flag changes it


def saved_config(run_dir: Path) -> Path | None:
    path = Path(run_dir) / CONFIG_FILE
    return path if path.is_file() else None


def save_config(cfg: NodeConfig, run_dir: Path) -> Path:
    """Write the effective config into the run folder (atomically: a crash leaves the old one or the new)."""
    path = Path(run_dir) / CONFIG_FILE
    header = "# The effective config of this run, written by swarmnode at start; restarts read it.\n"
    atomic_write(path, header + yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path


def holds_rounds(run_dir: Path) -> bool:
    """Whether a start in this folder completed a round (the round log or a checkpoint says so)."""
    checkpoints = Path(run_dir) / "checkpoints"
    return bool(RunLog(Path(run_dir)).records()) or (checkpoints.is_dir() and any(checkpoints.iterdir()))


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_leaves(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def differing_fields(old: NodeConfig, new: NodeConfig) -> dict[str, tuple[Any, Any]]:
    """dotted field -> (old value, new value), for every field that differs and may not change freely."""
    before, after = _leaves(old.model_dump(mode="json")), _leaves(new.model_dump(mode="json"))
    return {
        key: (before.get(key), after.get(key))
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key) and not key.startswith(FREE_ON_RESTART)
    }


def config_for_run(
    path: Path | None,
    overrides: dict[str, Any] | None = None,
    *,
    restart: bool = True,
    reconfigure: bool = False,
) -> NodeConfig:
    """The config for a command on a run folder: the folder's saved config under the user's YAML and
    ``--set``s, or plain ``load_config`` for a folder that holds no run yet.

    Raises ConfigError naming each field that conflicts with the saved config: for a ``restart`` (the run
    goes on training) any field that may not change freely unless ``reconfigure``; for commands that
    only read the run (eval, export, config show) the model alone, whose weights the checkpoints hold.
    A restart of a folder that holds no round yet (``holds_rounds``) is a first start.
    """
    cfg = load_config(path, overrides)  # which run folder, and the user's input checked on its own
    saved = saved_config(cfg.run.run_dir)
    if saved is None or (restart and not holds_rounds(cfg.run.run_dir)):
        return cfg  # nothing trained under the saved config: this start's own config is the run's
    merged = load_config(path, overrides, base=saved)
    previous = load_config(base=saved)
    conflicts = differing_fields(previous, merged)
    fixed = {k: v for k, v in conflicts.items() if k.startswith(FIXED_ON_RESTART)}
    if fixed or (conflicts and restart and not reconfigure):
        listed = "; ".join(
            f"{k}: {old!r} in the run, {new!r} now" for k, (old, new) in (fixed or conflicts).items()
        )
        remedy = (
            "the checkpoints hold this model's weights: start a new run folder (--run-dir) for another model"
            if fixed
            else "drop the --config/--set that changes them, or pass --reconfigure to go on with them"
        )
        raise ConfigError(f"{saved} differs from this start's config ({listed}); {remedy}")
    return merged


KNOWN_PEERS_FILE = "known_peers.json"
MAX_KNOWN_PEERS = 16  # peers' addresses remembered for a restart: enough to find a swarm, one line each
MAX_KNOWN_PEERS_BYTES = 64 * 1024  # a known_peers.json larger than this is not read (it is not ours)
MAX_KNOWN_ADDR_BYTES = 256  # the wire's MAX_ADDR_BYTES


@dataclass(frozen=True)
class KnownPeers:
    """Where this node was in the network when it last ran: its TCP listen port and peers' addresses."""

    port: int | None
    peers: tuple[str, ...]


def save_known_peers(run_dir: Path, known: KnownPeers) -> None:
    """Write ``known_peers.json`` atomically, at most MAX_KNOWN_PEERS addresses."""
    data = {"port": known.port, "peers": list(known.peers[:MAX_KNOWN_PEERS])}
    atomic_write(Path(run_dir) / KNOWN_PEERS_FILE, json.dumps(data, indent=1) + "\n")


def _is_peer_addr(addr: Any) -> bool:
    return (
        isinstance(addr, str)
        and addr.startswith("/")
        and "/p2p/" in addr
        and "p2p-circuit" not in addr  # hivemind would dial the relay, not the peer
        and len(addr.encode()) <= MAX_KNOWN_ADDR_BYTES
        and addr.isprintable()
        and not any(c.isspace() for c in addr)
    )


def load_known_peers(run_dir: Path) -> KnownPeers | None:
    """The folder's known peers, or None (none saved; or a damaged file: ignored with one line)."""
    path = Path(run_dir) / KNOWN_PEERS_FILE
    try:
        if path.stat().st_size > MAX_KNOWN_PEERS_BYTES:
            raise ValueError(f"over {MAX_KNOWN_PEERS_BYTES} bytes")
        data = json.loads(path.read_text())
        port = data["port"]
        if port is not None and not (type(port) is int and 0 < port < 65536):
            raise ValueError(f"port {port!r}")
        peers = [addr for addr in data["peers"] if _is_peer_addr(addr)]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:  # JSONDecodeError: ValueError
        log(f"ignoring {path}: not a known-peers file this version wrote ({exc}); starting as a new node")
        return None
    return KnownPeers(port, tuple(peers[:MAX_KNOWN_PEERS]))
