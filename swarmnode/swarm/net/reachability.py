"""Can peers open connections to this node? The dial-back check a node runs at start.

Why a check of our own: a node behind NAT or a firewall that joins the DHT as a full server gets into
other nodes' routing tables and their requests to it time out, slowing everyone. hivemind's bootstrap ping
("validate") does not notice, because the peer answers over the connection the new node opened, which any
firewall lets through. libp2p's AutoNAT does dial back, but the daemon does not tell its client the result.

So a node asks some of its initial peers to open a *new* TCP connection to it (stream
``DIALBACK_STREAM``): the request lists the TCP ports it listens on; the peer connects to each port at
the IP address it sees the request come from, and answers one byte per port (1 = connected). Only the
requester's own observed address is ever dialled, so the service cannot be used to make a node connect
to third parties, and concurrent dial-backs are capped. A plain TCP connect is enough: it is the step a
firewall or NAT blocks, and it costs the answering peer no libp2p handshake.

``verdict`` turns the answers into reachable / unreachable / unknown (no peer could answer).

The answering side remembers who it could not dial back (``DialbackServer.behind_nat``, at most
MAX_PEERS_BEHIND_NAT): those peers are behind NAT, and a reachable node that holds a batch offers it to
them (``holder_offer_targets``, at most HOLDER_OFFER_FANOUT per batch). That is how two NATed nodes
exchange where no relay can join them (a relay's private address gives no relayed one; docs/operators.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Literal

from swarmnode.swarm.net.streams import open_stream

DIALBACK_STREAM = "/swarmnode/v1/dialback"
MAX_PORTS = 4
DIAL_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 5.0
ASK_WINDOW_S = 12.0  # the asker's wait for one peer, tries included: its 3 s dials and a loaded peer's slack
ASK_ATTEMPTS = 3
ASK_RETRY_S = 1.0
MAX_CONCURRENT_DIALBACKS = 8
PEERS_ASKED = 3
MAX_PEERS_BEHIND_NAT = 1024  # peers remembered as not dialable, the least recently checked forgotten first
HOLDER_OFFER_FANOUT = 8  # peers behind NAT a holder offers one batch to (a notice each)

Verdict = Literal["reachable", "unreachable", "unknown"]


def encode_request(ports: Sequence[int]) -> bytes:
    """One byte with the count (1..MAX_PORTS), then each port as 2 bytes big-endian."""
    if not 0 < len(ports) <= MAX_PORTS or not all(0 < p < 65536 for p in ports):
        raise ValueError(f"1..{MAX_PORTS} ports in 1..65535, got {list(ports)}")
    return bytes([len(ports)]) + b"".join(p.to_bytes(2, "big") for p in ports)


def tcp_ports(maddrs: Iterable[str]) -> list[int]:
    """The distinct TCP ports of direct (non-relay) multiaddrs, at most MAX_PORTS, in order."""
    ports: list[int] = []
    for maddr in maddrs:
        parts = str(maddr).strip("/").split("/")
        if "p2p-circuit" in parts or "tcp" not in parts:
            continue
        port = int(parts[parts.index("tcp") + 1])
        if port and port not in ports:
            ports.append(port)
    return ports[:MAX_PORTS]


def observed_ip(maddr: str) -> str | None:
    """The IP of ``/ip4/X/tcp/..`` or ``/ip6/X/tcp/..``; None for anything else (a relayed stream)."""
    parts = str(maddr).strip("/").split("/")
    if len(parts) < 2 or parts[0] not in ("ip4", "ip6") or "p2p-circuit" in parts:
        return None
    try:
        return str(ipaddress.ip_address(parts[1]))
    except ValueError:
        return None


def holder_offer_targets(nat_peers: Iterable[str], live: Collection[str], skip: Collection[str]) -> list[str]:
    """The peers to tell "I hold this batch": behind NAT, live in our roster, not in ``skip`` (its author
    and whoever served it to us); at most HOLDER_OFFER_FANOUT, drawn at random so that peer ids which
    asked for dial-backs they could never pass do not always crowd out the same honest ones."""
    candidates = [peer for peer in nat_peers if peer in live and peer not in skip]
    return random.sample(candidates, min(len(candidates), HOLDER_OFFER_FANOUT))


def _answered(answers: Sequence[bytes | str]) -> list[bytes]:
    return [a for a in answers if isinstance(a, bytes) and a]


def verdict(answers: Sequence[bytes | str]) -> Verdict:
    """Reachable if any peer connected to any of our ports; unreachable if peers answered and none
    connected; unknown if no peer answered (none serves the check, or none was asked). An answer is
    bytes; a str says why a peer gave none."""
    answered = _answered(answers)
    if any(1 in answer for answer in answered):
        return "reachable"
    return "unreachable" if answered else "unknown"


def note(verdict_: Verdict, answers: Sequence[bytes | str], ports: Sequence[int]) -> str:
    """One line for the user saying what the dial-back check decided (client mode: what to do)."""
    answered = len(_answered(answers))
    if verdict_ == "reachable":
        return f"peers can open connections to this node ({answered} checked)"
    if verdict_ == "unknown":
        why = "; ".join(a for a in answers if isinstance(a, str)) or "no TCP port to check"
        return (
            f"not checked: no initial peer answered the dial-back check ({why}); running as a full DHT node"
        )
    return (
        f"{answered} peer(s) could not open a connection to this node on TCP port(s) "
        f"{', '.join(map(str, ports))}, so it runs in client mode: it connects out to peers and they pull "
        "its rollouts over those connections (relays are used where peers offer them). To serve fully, "
        "give it a fixed port, allow or forward that port in your firewall/router, and pass "
        "--announce /ip4/<your public IP>/tcp/<port>"
    )


async def _can_connect(ip: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), DIAL_TIMEOUT_S)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


class DialbackServer:
    """The answering side, as a hivemind binary stream handler; never raises into the daemon client."""

    def __init__(self) -> None:
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_DIALBACKS)
        self._behind_nat: OrderedDict[str, None] = OrderedDict()  # on the event loop only
        self.behind_nat: frozenset[str] = frozenset()  # its snapshot, for any thread to read

    def _remember(self, peer: str, connected: Sequence[bool]) -> None:
        if any(connected):
            self._behind_nat.pop(peer, None)
        else:
            self._behind_nat[peer] = None
            self._behind_nat.move_to_end(peer)
            while len(self._behind_nat) > MAX_PEERS_BEHIND_NAT:
                self._behind_nat.popitem(last=False)
        self.behind_nat = frozenset(self._behind_nat)

    async def handle(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ip = observed_ip(str(info.addr))
            if ip is None or self._slots.locked():
                return  # relayed, or too busy: closing unanswered reads as "unknown" on the other side
            async with self._slots:
                count = (await asyncio.wait_for(reader.readexactly(1), REQUEST_TIMEOUT_S))[0]
                if not 0 < count <= MAX_PORTS:
                    return
                raw = await asyncio.wait_for(reader.readexactly(2 * count), REQUEST_TIMEOUT_S)
                ports = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]
                results = await asyncio.gather(*(_can_connect(ip, port) for port in ports))
                self._remember(info.peer_id.to_base58(), results)
                writer.write(bytes(int(ok) for ok in results))
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


async def ask(p2p: Any, peer_id: str, ports: Sequence[int]) -> bytes | str:
    """Ask ``peer_id`` to dial us back on ``ports``: its answer (bytes, one per port), or why it has none.

    A stream that fails at once is tried again (at most ASK_ATTEMPTS, ASK_RETRY_S apart): at start the
    connection to an initial peer may still be settling, and a lone "unknown" would keep a node behind
    NAT in the DHT as a full server. All tries together end within ASK_WINDOW_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ASK_WINDOW_S
    reason = "not asked"
    for attempt in range(1, ASK_ATTEMPTS + 1):
        try:
            return await asyncio.wait_for(_exchange(p2p, peer_id, ports), deadline - loop.time())
        except TimeoutError:
            reason = f"no answer within {ASK_WINDOW_S:g} s"
            break
        except Exception as e:  # no such handler (an older peer), gone, closed unanswered (too busy)
            reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if attempt == ASK_ATTEMPTS or deadline - loop.time() <= ASK_RETRY_S:
            break
        await asyncio.sleep(ASK_RETRY_S)
    return f"{peer_id[-8:]}: {reason}"


async def _exchange(p2p: Any, peer_id: str, ports: Sequence[int]) -> bytes:
    reader, writer = await open_stream(p2p, peer_id, DIALBACK_STREAM)
    try:
        writer.write(encode_request(ports))
        await writer.drain()
        return await reader.readexactly(len(ports))
    finally:
        writer.close()
