"""Sybil ids that ask a node for a payload and never read the answer, in their own process
(tests/integration/test_slow_readers.py).

    python tests/helpers/slow_readers.py <target multiaddr> <work dir> <digest hex> [sybils]

Starts ``sybils`` (default SYBILS) libp2p peers with fresh identities (one p2pd each; the hosts and the
reports are ``slot_hog.hold_slots``). Each keeps ``slot_hog.STREAMS_PER_SYBIL`` tasks that open a payload
stream, write the 32-byte pull request for ``digest`` at once and never read a byte; a task opens its next
stream every REOPEN_S (so a slot the target frees is taken again at once), drops a stream the target
closed unanswered and abandons (aborts) one HOLD_S after opening it. Prints ``HOLDING {"sybils": n}``
once every task has a stream up, then ``OPENED {"streams": n}`` every ``slot_hog.REPORT_S`` seconds; runs
until the test kills it by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from collections import deque
from pathlib import Path

from hivemind.p2p import P2P, PeerID
from slot_hog import OPENED, hold_slots  # a sibling script: tests/helpers/ is sys.path[0] when run

from swarmnode.swarm.wire.framing import PAYLOAD_STREAM, encode_pull_request

SYBILS = 8
REOPEN_S = 0.5
HOLD_S = 60.0  # longer than any serving deadline, old or new: the target decides when a slot ends
MAX_HELD = 64  # streams one task keeps open on its side (the oldest is aborted past it)


async def hold(p2p: P2P, target: PeerID, ready: asyncio.Event, *, request: bytes) -> None:
    """Ask, never read; a new stream every REOPEN_S, each kept (unread) HOLD_S, forever."""
    held: deque[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = deque()
    while True:
        try:
            _, reader, writer = await asyncio.wait_for(
                p2p.call_binary_stream_handler(target, PAYLOAD_STREAM), 10
            )
            writer.write(request)
            await asyncio.wait_for(writer.drain(), 5)
            held.append((time.monotonic(), reader, writer))
            OPENED["slow_readers"] += 1
            ready.set()
        except Exception:  # noqa: BLE001 - refused, reset or slow: try the next one
            pass
        now = time.monotonic()
        for entry in [e for e in held if e[1].at_eof()]:  # refused: closed with nothing sent
            held.remove(entry)
            entry[2].transport.abort()
        while held and (len(held) > MAX_HELD or now - held[0][0] > HOLD_S):
            with contextlib.suppress(Exception):
                held.popleft()[2].transport.abort()
        await asyncio.sleep(REOPEN_S)


async def main() -> None:
    target_addr, work_dir, digest = sys.argv[1], Path(sys.argv[2]), bytes.fromhex(sys.argv[3])
    sybils = int(sys.argv[4]) if len(sys.argv) > 4 else SYBILS
    request = encode_pull_request(digest)
    await hold_slots(target_addr, work_dir, sybils, "slow", functools.partial(hold, request=request))


if __name__ == "__main__":
    asyncio.run(main())
