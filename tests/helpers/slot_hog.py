"""Sybil ids that hold a node's serving slots, in their own process (test_serving_slots.py).

    python tests/helpers/slot_hog.py <target multiaddr> <work dir> [sybils]

Starts ``sybils`` (default SYBILS) libp2p peers with fresh identities (one p2pd each), each of which keeps
STREAMS_PER_SYBIL payload streams open at the target without ever sending its request, and re-opens a
stream as soon as the target closes it. Prints ``HOLDING {"sybils": n}`` once every Sybil has its streams
up, then ``OPENED {"streams": n}`` every REPORT_S seconds; runs until the test kills it by PID.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

from hivemind.p2p import P2P, PeerID

from swarmnode.identity import Identity
from swarmnode.swarm.wire.framing import PAYLOAD_STREAM

SYBILS = 16
STREAMS_PER_SYBIL = 4  # the serving node's per-peer cap
REPORT_S = 2.0
OPENED: Counter[str] = Counter()  # streams opened, by helper


async def hold(p2p: P2P, target: PeerID, ready: asyncio.Event) -> None:
    """One stream slot, held idle for as long as the target lets it, then re-opened, forever."""
    while True:
        try:
            _, reader, writer = await p2p.call_binary_stream_handler(target, PAYLOAD_STREAM)
            OPENED["slot_hog"] += 1
            ready.set()
            await reader.read()  # returns when the target closes the stream
            writer.close()
        except Exception:  # noqa: BLE001 - refused or reset: open the next one
            await asyncio.sleep(0.01)


async def hold_slots(target_addr: str, work_dir: Path, sybils: int, key_prefix: str, hold_one) -> None:
    """Start ``sybils`` hosts with fresh identities, each running STREAMS_PER_SYBIL ``hold_one(p2p,
    target, ready)`` tasks; say HOLDING once every task has a stream up, then OPENED every REPORT_S
    (``opened`` of ``hold_one``'s module: ``count_opened``). Shared with slow_readers.py."""
    target = PeerID.from_base58(target_addr.rsplit("/p2p/", 1)[1])
    work_dir.mkdir(parents=True, exist_ok=True)
    tasks, events = [], []
    for i in range(sybils):
        key = work_dir / f"{key_prefix}-{i}.key"
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
            tasks.append(asyncio.create_task(hold_one(p2p, target, ready)))
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 120)
    print("HOLDING " + json.dumps({"sybils": sybils}), flush=True)
    while True:
        await asyncio.sleep(REPORT_S)
        print("OPENED " + json.dumps({"streams": sum(OPENED.values())}), flush=True)


async def main() -> None:
    target_addr, work_dir = sys.argv[1], Path(sys.argv[2])
    sybils = int(sys.argv[3]) if len(sys.argv) > 3 else SYBILS
    await hold_slots(target_addr, work_dir, sybils, "sybil", hold)


if __name__ == "__main__":
    asyncio.run(main())
