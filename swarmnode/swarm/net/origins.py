"""Origins: the network a stream comes from, so that what one network can take is bounded, not only what
one identity can (identities are free; addresses are not).

A stream's *origin* is the network of its remote address as libp2p reports it (hivemind's ``StreamInfo``
``addr``): the IPv4 /24 (``ORIGIN_PREFIX_V4``) or IPv6 /48 (``ORIGIN_PREFIX_V6``) it lies in, written
``"203.0.113.0/24"``. An address with no IP of its own has no origin (None) and is not capped: a relayed
(``/p2p-circuit``) connection (its address is the relay's, shared by every peer behind it) or one that
is not IP. Loopback (127.0.0.0/8, ::1) is exempt unless ``swarm.origin_cap_exempt_loopback`` is off:
on one machine every peer is one origin.

``OriginCaps`` remembers which peer ids were admitted from each origin and admits at most
``per_origin`` (``swarm.identities_per_origin``) distinct ones; an id is remembered ORIGIN_MEMORY_S after
it was last seen, at most MAX_ORIGINS origins (least recently seen forgotten first), so it holds at most
MAX_ORIGINS x ``per_origin`` ids whatever peers send. Users: ``notices.NoticeReceiver`` (identities
admitted through notices) and ``payloads.PayloadServer`` (serving slots per origin).
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict

from swarmnode.config import SwarmConfig

ORIGIN_PREFIX_V4 = 24
ORIGIN_PREFIX_V6 = 48
ORIGIN_MEMORY_S = 600.0  # a peer id counts for its origin this long after it was last seen there
MAX_ORIGINS = 1024  # origins remembered (x identities_per_origin ids at most)


def origin_of(addr: object, *, exempt_loopback: bool = True) -> str | None:
    """``"/ip4/203.0.113.7/tcp/4001"`` -> ``"203.0.113.0/24"``; IPv6 -> its /48. None when the address
    names no network a cap applies to: not IP, relayed, unparseable, or loopback while exempt."""
    parts = str(addr).split("/")
    if "p2p-circuit" in parts or len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return None
    try:
        ip = ipaddress.ip_address(parts[2])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback and exempt_loopback:
        return None
    prefix = ORIGIN_PREFIX_V4 if ip.version == 4 else ORIGIN_PREFIX_V6
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


class OriginCaps:
    """At most ``per_origin`` distinct peer ids per origin (module docstring). Not thread-safe: one event
    loop uses it."""

    def __init__(
        self,
        per_origin: int,
        *,
        exempt_loopback: bool = True,
        memory_s: float = ORIGIN_MEMORY_S,
        max_origins: int = MAX_ORIGINS,
    ):
        if per_origin < 1:
            raise ValueError("per_origin must be >= 1")
        self.per_origin = per_origin
        self.exempt_loopback = exempt_loopback
        self.memory_s = memory_s
        self.max_origins = max_origins
        # origin -> (peer id -> last seen), both least recently seen first
        self._ids: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()

    @classmethod
    def from_config(cls, swarm: SwarmConfig) -> OriginCaps:
        return cls(swarm.identities_per_origin, exempt_loopback=swarm.origin_cap_exempt_loopback)

    def origin(self, addr: object) -> str | None:
        """``origin_of(addr)`` under this cap's loopback rule."""
        return origin_of(addr, exempt_loopback=self.exempt_loopback)

    def admit(self, origin: str | None, peer_id: str, now: float | None = None) -> bool:
        """Whether ``peer_id`` may be admitted from ``origin`` (True: remembered, or seen again); False
        when its origin already has ``per_origin`` other ids. No origin (None): always True."""
        if origin is None:
            return True
        now = time.monotonic() if now is None else now
        ids = self._ids.pop(origin, None)
        if ids is None:
            ids = OrderedDict()
        while ids and now - next(iter(ids.values())) > self.memory_s:
            ids.popitem(last=False)
        admitted = peer_id in ids or len(ids) < self.per_origin
        if admitted:
            ids.pop(peer_id, None)
            ids[peer_id] = now
        if ids:
            self._ids[origin] = ids  # most recently seen last
        while len(self._ids) > self.max_origins:
            self._ids.popitem(last=False)
        return admitted

    def known(self, origin: str) -> int:
        """Peer ids remembered for ``origin`` (expired ones included until its next ``admit``)."""
        return len(self._ids.get(origin, ()))
