"""Which swarm a connected peer is in: the ``/swarmnode/v1/hello`` stream.

A node that joined through a member of another swarm (a mistyped or missing ``swarm.swarm_id``) sees
connections but no roster card of its own swarm, because roster keys are named by the swarm id. Asking a
few connected peers for theirs turns "no peers" into "your peer is in swarm 'X': pass
--set swarm.swarm_id=X". Swarm ids are not secret: they name public DHT keys.

The answer is one length byte and the id (at most ``MAX_SWARM_ID_BYTES``); the asker sends nothing. What a
peer can make this node spend: ``MAX_CONCURRENT_HELLOS`` streams answered at once and
``MAX_HELLOS_PER_MINUTE`` answers a minute (beyond: closed unanswered), 65 bytes each; asking reads at
most 65 bytes from each of at most ``PEERS_ASKED`` peers, within ``ASK_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

from swarmnode.swarm.net.streams import open_stream
from swarmnode.swarm.wire.limits import MAX_SWARM_ID_BYTES, ProtocolError, validate_swarm_id

HELLO_STREAM = "/swarmnode/v1/hello"
MAX_CONCURRENT_HELLOS = 4
MAX_HELLOS_PER_MINUTE = 120
PEERS_ASKED = 3
ASK_TIMEOUT_S = 3.0


class HelloServer:
    """Answers with this node's swarm id, as a hivemind binary stream handler; never raises."""

    def __init__(self, swarm_id: str):
        data = swarm_id.encode()
        self.answer = bytes([len(data)]) + data
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_HELLOS)
        self._answered: deque[float] = deque(maxlen=MAX_HELLOS_PER_MINUTE)
        self.refused = 0  # streams closed unanswered (busy or over the rate)

    async def handle(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            now = time.monotonic()
            full = len(self._answered) == MAX_HELLOS_PER_MINUTE and now - self._answered[0] < 60.0
            if full or self._slots.locked():
                self.refused += 1
                return
            async with self._slots:
                self._answered.append(now)
                writer.write(self.answer)
                await asyncio.wait_for(writer.drain(), ASK_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


async def ask(p2p: Any, peer_id: str, timeout_s: float = ASK_TIMEOUT_S) -> str | None:
    """``peer_id``'s swarm id, or None (no such handler, e.g. a bootstrap or an older node; gone; a bad
    answer)."""

    writer = None

    async def exchange() -> str:
        nonlocal writer
        reader, writer = await open_stream(p2p, peer_id, HELLO_STREAM)
        length = (await reader.readexactly(1))[0]
        if not 0 < length <= MAX_SWARM_ID_BYTES:
            raise ProtocolError("bad_field", f"swarm id of {length} bytes")
        return validate_swarm_id((await reader.readexactly(length)).decode())

    try:
        return await asyncio.wait_for(exchange(), timeout_s)
    except Exception:
        return None
    finally:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
