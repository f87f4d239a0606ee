"""A node for test_transport.py that serves one payload slowly, so the test can kill it mid-transfer.

Usage: python _serve_slowly.py IDENTITY_PATH INITIAL_PEER_MULTIADDR

Prints ``READY {"peer_id": ..., "maddrs": [...]}`` once up, and ``STREAMING`` once it has sent the
first chunk of SLOW_DIGEST's payload (4 MiB at ~256 KiB/s). It exits by itself after 120 s.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from swarmnode.config import SwarmConfig
from swarmnode.swarm.net.payloads import PayloadServer
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire.framing import encode_frame_header

SLOW_DIGEST = b"\x51" * 32
SLOW_BYTES = 4 * 1024 * 1024
CHUNK = 64 * 1024
CHUNK_DELAY_S = 0.25
LIFETIME_S = 120.0


class SlowPayloads(PayloadServer):
    async def _send_payload(self, writer: asyncio.StreamWriter, digest: bytes) -> None:
        if digest != SLOW_DIGEST:
            return await super()._send_payload(writer, digest)
        writer.write(encode_frame_header(SLOW_BYTES))
        for i in range(SLOW_BYTES // CHUNK):
            writer.write(b"s" * CHUNK)
            await writer.drain()
            if i == 0:
                print("STREAMING", flush=True)
            await asyncio.sleep(CHUNK_DELAY_S)


def main() -> None:
    identity_path, initial_peer = sys.argv[1], sys.argv[2]
    transport = Transport(
        Path(identity_path),
        SwarmConfig(initial_peers=[initial_peer]),
        payloads=SlowPayloads(serve_timeout_s=60),
    )
    try:
        maddrs = transport.start()
        print("READY " + json.dumps({"peer_id": transport.peer_id, "maddrs": maddrs}), flush=True)
        deadline = time.monotonic() + LIFETIME_S
        while time.monotonic() < deadline:  # the test kills us long before this
            time.sleep(0.2)
    finally:
        transport.shutdown()


if __name__ == "__main__":
    main()
