"""Sections ``swarm`` and ``bootstrap``: how a node joins a swarm and what it shares there, the bounds
it holds peers to (view, bans, per-network caps, identity work), and the DHT-only bootstrap node that
other nodes join through."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from swarmnode.config.strict import Strict

RENAMED_SWARM_KEYS = {"external_per_round": "peer_groups_per_round"}  # old -> new, accepted until 0.3


class SwarmConfig(Strict):
    @model_validator(mode="after")
    def _min_peers_fit_the_view(self) -> SwarmConfig:
        if self.min_peers >= self.view_size:
            raise ValueError(
                f"swarm.min_peers={self.min_peers} must be < swarm.view_size={self.view_size}, or every "
                "start waits out swarm.wait_for_peers_s for peers its view cannot hold: lower "
                "swarm.min_peers or raise swarm.view_size"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """Accept keys renamed in 0.2 for one more release, with a line saying what to write instead."""
        if not isinstance(data, dict):
            return data
        for old, new in RENAMED_SWARM_KEYS.items():
            if old in data:
                if new in data:
                    raise ValueError(f"swarm.{old} is the old name of swarm.{new}: give only swarm.{new}")
                warnings.warn(
                    f"swarm.{old} is deprecated and will be removed in the next release; write swarm.{new}",
                    FutureWarning,
                    stacklevel=2,
                )
                data = {**{k: v for k, v in data.items() if k != old}, new: data[old]}
        return data

    swarm_id: str = Field("swarmnode-local", min_length=1, max_length=64, description="Swarm namespace.")
    initial_peers: list[str] = Field(default_factory=list, description="Multiaddrs of peers to join through.")

    @field_validator("initial_peers")
    @classmethod
    def _full_multiaddrs(cls, peers: list[str]) -> list[str]:
        """Checked here, before any model loads; the transport parses them fully at start."""
        for addr in peers:
            if not addr.startswith("/") or "/p2p/" not in addr or any(c.isspace() for c in addr):
                raise ValueError(
                    f"{addr!r} is not a full multiaddr; expected something like "
                    "/ip4/1.2.3.4/tcp/31337/p2p/12D3KooW... (copy it from the other node's startup log)"
                )
        return peers

    host_maddrs: list[str] = Field(
        default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"], description="Addresses the node listens on."
    )
    announce_maddrs: list[str] = Field(
        default_factory=list,
        description="Addresses peers should dial, for a node with a public IP or a forwarded port: "
        "/ip4/PUBLIC_IP/tcp/PORT (a fixed port; set by --announce).",
    )
    reachability: Literal["auto", "public", "private"] = Field(
        "auto",
        description="auto: at start, initial peers try to connect back; if none can, run as a DHT client "
        "that connects out (and uses relays). public: serve without checking (and relay for others). "
        "private: always client mode.",
    )
    require_initial_peers: bool = Field(
        False,
        description="Refuse to start without initial peers (a public-network config: alone, the node would "
        "quietly found a swarm of its own).",
    )
    peer_groups_per_round: int = Field(
        4,
        ge=0,
        description="Peer question groups trained on per round (J in SAPO's I local + J peer); "
        "at most half of them from one peer, taken round-robin across peers.",
    )
    share_logprobs: bool = Field(
        True,
        description="Ship per-token log-probs with shared completions; without them, same-tokenizer "
        "peers train on this node's text as foreign data (offpolicy.foreign).",
    )
    share_deadline_s: float = Field(
        10.0, gt=0, description="How long a round waits for peer groups before training without them."
    )
    min_peers: int = Field(
        0,
        ge=0,
        description="Peers to wait for before the first round (0 = start at once); the wait also ends once "
        "a live peer has begun its rounds (the swarm is running: join it).",
    )
    wait_for_peers_s: float = Field(
        120.0, gt=0, description="Longest wait for min_peers before starting anyway."
    )
    view_size: int = Field(
        128,
        ge=8,
        le=512,
        description="Peers this node keeps in its view of the swarm (its roster): whom it notifies, polls "
        "and waits for; half of it stays open to peers that have not delivered yet. Its size, not the "
        "swarm's, sets this node's per-round work: a larger view hears of more batches sooner and costs "
        "more DHT reads (docs/scaling.md).",
    )
    ban_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="How long a peer's first ban lasts; each further ban of the same peer doubles it, "
        "up to an hour.",
    )
    identities_per_origin: int = Field(
        16,
        ge=1,
        description="Peer ids admitted through notices from one network (IPv4 /24, IPv6 /48) within 10 "
        "min; more from it are refused (origin_cap). Relayed connections are not capped.",
    )
    origin_cap_exempt_loopback: bool = Field(
        True,
        description="Exempt loopback peers (127.0.0.0/8, ::1) from the per-network caps: on one machine "
        "every peer is one network (tests, one-machine swarms).",
    )
    identity_work_bits: int = Field(
        16,
        ge=0,
        le=32,
        description="Proof of work an identity must carry to be admitted (swarm.wire.work): a nonce "
        "whose hash with the peer's public key starts with this many zero bits. Minting costs 2^bits "
        "hashes once per key (16: ~0.03 s; 26: ~30 s of one core), kept beside the key file; peers "
        "whose roster card proves fewer bits are refused, so the nodes of one swarm use one value.",
    )


class BootstrapConfig(Strict):
    """`swarmnode bootstrap`: a DHT-only node (no model) that other nodes join through."""

    host_maddrs: list[str] = Field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/31337"],
        description="Where the bootstrap listens: a fixed port, so the address in configs stays valid.",
    )
    identity_path: Path = Field(
        Path("bootstrap.key"),
        description="Its Ed25519 key (created if missing): the /p2p/ part of its address. Back it up.",
    )
    metrics_host: str = Field("127.0.0.1", description="Address of /metrics and /health (0.0.0.0 = all).")
    metrics_port: int | None = Field(
        9401, ge=0, le=65535, description="Port of /metrics and /health (0 = any free port, None = off)."
    )
    report_every_s: float = Field(60.0, gt=0, description="Seconds between status lines in the log.")
