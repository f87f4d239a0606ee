"""Opening a libp2p stream to a peer under the caller's deadline without ever dropping it open.

Every exchange with a peer (a pull, a notice, a dial-back check, a hello) opens a stream and runs under
one deadline (``asyncio.wait_for``). If the deadline cancels the caller while the daemon is still opening
the stream, hivemind's open completes anyway and its reader and writer are dropped unclosed; the garbage
collector then closes them from whatever thread it runs in, which asyncio does not survive quietly
("Exception ignored in StreamWriter.__del__", seen under a Sybil flood of silent holders). So the open
is shielded from the cancellation, and a stream that opens after its caller gave up is closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def open_stream(
    p2p: Any, peer_id: str, protocol: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A new stream to ``peer_id`` for ``protocol``: (reader, writer); the caller closes the writer."""
    from hivemind.p2p import PeerID

    opening = asyncio.ensure_future(p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), protocol))
    try:
        _, reader, writer = await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_late)
        raise
    return reader, writer


def _close_late(opening: asyncio.Future) -> None:
    """Close a stream that opened after its caller's deadline (or swallow the failure it ended with)."""
    if opening.cancelled() or opening.exception() is not None:
        return
    with contextlib.suppress(Exception):
        opening.result()[2].close()
