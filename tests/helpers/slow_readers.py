"""Sybil ids that ask a node for a payload and never read the answer, in their own process
(tests/integration/test_slow_readers.py).

    python tests/helpers/slow_readers.py <target multiaddr> <work dir> <digest hex> [sybils]

Starts ``sybils`` (default SYBILS) libp2p peers with fresh identities (one p2pd each). Each keeps
STREAMS_PER_SYBIL tasks that open a payload stream, write the 32-byte pull request for ``digest`` at once
and never read a byte; a task opens its next stream every REOPEN_S (so a slot the target frees is taken
again at once), drops a stream the target closed unanswered and abandons (aborts) one HOLD_S after
opening it. Prints ``HOLDING {"sybils": n}``
once every task has a stream up, then ``OPENED {"streams": n}`` every REPORT_S seconds; runs until the
test kills it by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import deque
from pathlib import Path

from hivemind.p2p import P2P, PeerID

from swarmnode.identity import Identity
from swarmnode.swarm.wire.framing import PAYLOAD_STREAM, encode_pull_request

SYBILS = 8
STREAMS_PER_SYBIL = 4  # the serving node's per-peer cap: 8 x 4 = the 32 slots open to any peer
REOPEN_S = 0.5
HOLD_S = 60.0  # longer than any serving deadline, old or new: the target decides when a slot ends
MAX_HELD = 64  # streams one task keeps open on its side (the oldest is aborted past it)
REPORT_S = 2.0
opened = 0


async def hold(p2p: P2P, target: PeerID, request: bytes, ready: asyncio.Event) -> None:
    """Ask, never read; a new stream every REOPEN_S, each kept (unread) HOLD_S, forever."""
    global opened
    held: deque[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]] = deque()
    while True:
        try:
            _, reader, writer = await asyncio.wait_for(
                p2p.call_binary_stream_handler(target, PAYLOAD_STREAM), 10
            )
            writer.write(request)
            await asyncio.wait_for(writer.drain(), 5)
            held.append((time.monotonic(), reader, writer))
            opened += 1
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
    target = PeerID.from_base58(target_addr.rsplit("/p2p/", 1)[1])
    request = encode_pull_request(digest)
    work_dir.mkdir(parents=True, exist_ok=True)
    tasks, events = [], []
    for i in range(sybils):
        key = work_dir / f"slow-{i}.key"
        Identity.generate().save(key)
        # check_if_identity_free=False: hivemind's check parses only RSA keys (PROTOCOL.md section 13)
        p2p = await P2P.create(
            identity_path=str(key),
            initial_peers=[target_addr],
            host_maddrs=["/ip4/127.0.0.1/tcp/0"],
            check_if_identity_free=False,
        )
        for _ in range(STREAMS_PER_SYBIL):
            ready = asyncio.Event()
            events.append(ready)
            tasks.append(asyncio.create_task(hold(p2p, target, request, ready)))
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 120)
    print("HOLDING " + json.dumps({"sybils": sybils}), flush=True)
    while True:
        await asyncio.sleep(REPORT_S)
        print("OPENED " + json.dumps({"streams": opened}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
