"""Per-origin caps (issue #26) on real libp2p streams from 127.0.0.1: identities are free, addresses are not.

Six fresh identities (one p2pd each, in this process) send the receiver one notice each, with their roster
card. With the loopback exemption off and ``identities_per_origin`` 3, the first three are taken and the
rest refused as ``origin_cap``, as is a card one of the three relays for a fourth author; with the
exemption on (the default), all six are taken. With the exemption off the same streams' origin also
bounds the serving slots that peers not in good standing may hold (``MAX_OPEN_STREAMS_PER_ORIGIN``)."""

from __future__ import annotations

import asyncio
import contextlib

from swarmnode.config import SwarmConfig
from swarmnode.identity import Identity
from swarmnode.swarm.net import notices
from swarmnode.swarm.net.origins import OriginCaps
from swarmnode.swarm.net.payloads import MAX_OPEN_STREAMS_PER_ORIGIN, PULL_REQUEST_TIMEOUT_S
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire.framing import PAYLOAD_STREAM

SENDERS = 6
CAP = 3
EXEMPT_STREAM = "/swarmnode-test/notice-exempt/1"  # the same receiver code, loopback exempt
STREAM_TIMEOUT_S = 10.0


async def _send(p2p, peer_id, stream: str, frame: bytes) -> None:
    """One notice on a new stream; waits until the receiver closes it (it has read the frame or refused)."""
    _, reader, writer = await asyncio.wait_for(
        p2p.call_binary_stream_handler(peer_id, stream), STREAM_TIMEOUT_S
    )
    try:
        writer.write(frame)
        await writer.drain()
        await asyncio.wait_for(reader.read(1), STREAM_TIMEOUT_S)
    except ConnectionError:  # refused: closed unread, possibly before our frame was taken
        pass
    finally:
        writer.close()


async def _attack(tmp_path, target_addr: str) -> int:
    """The six senders: notices on both streams, then 2 idle payload streams each, all at once, kept until
    the receiver's request timeout has passed. Returns how many payload streams were opened."""
    from hivemind.p2p import P2P, PeerID

    target = PeerID.from_base58(target_addr.rsplit("/p2p/", 1)[1])
    senders = []
    try:
        for i in range(SENDERS):
            key = tmp_path / f"sender-{i}.key"
            Identity.generate().save(key)
            # check_if_identity_free=False: hivemind's check parses only RSA keys (PROTOCOL.md section 13)
            senders.append(
                await P2P.create(identity_path=str(key), initial_peers=[target_addr],
                                 host_maddrs=["/ip4/127.0.0.1/tcp/0"], check_if_identity_free=False)
            )  # fmt: skip
        for p2p in senders:  # one at a time: the order decides which three are first
            me = p2p.peer_id.to_base58()
            frame = notices.encode_notice(me, b"announcement of " + me.encode(), b"card of " + me.encode())
            for stream in (notices.NOTICE_STREAM, EXEMPT_STREAM):
                await _send(p2p, target, stream, frame)
        relayed = notices.encode_notice("12D3KooWanotherauthor", b"announcement", b"its card")
        for stream in (notices.NOTICE_STREAM, EXEMPT_STREAM):
            await _send(senders[0], target, stream, relayed)  # admitted holder, a new author's card
        opened = await asyncio.gather(
            *(p2p.call_binary_stream_handler(target, PAYLOAD_STREAM) for p2p in senders for _ in range(2))
        )
        await asyncio.sleep(4 * PULL_REQUEST_TIMEOUT_S)  # refused at once, or closed for want of a request
        for _, _, writer in opened:
            writer.close()
        return len(opened)
    finally:
        for p2p in senders:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(p2p.shutdown(), 10)


def test_identities_and_serving_slots_per_origin_are_capped_on_loopback_when_not_exempt(tmp_path):
    cfg = SwarmConfig(identities_per_origin=CAP, origin_cap_exempt_loopback=False)
    taken: dict[str, list[tuple[str, str]]] = {notices.NOTICE_STREAM: [], EXEMPT_STREAM: []}

    def receiver(stream: str, origins: OriginCaps) -> notices.NoticeReceiver:
        def take(record: bytes, author: str, holder: str, card: bytes) -> bool:
            taken[stream].append((author, holder))
            return True

        return notices.NoticeReceiver(take, allow=lambda peer: True, origins=origins)

    capped = receiver(notices.NOTICE_STREAM, OriginCaps.from_config(cfg))
    exempt = receiver(EXEMPT_STREAM, OriginCaps.from_config(SwarmConfig(identities_per_origin=CAP)))
    key = tmp_path / "receiver.key"
    Identity.generate().save(key)
    r = Transport(key, cfg)
    r.serve(notices.NOTICE_STREAM, capped.handle)
    r.serve(EXEMPT_STREAM, exempt.handle)
    try:
        addrs = r.start()
        opened = asyncio.run(asyncio.wait_for(_attack(tmp_path, addrs[0]), 180))
        counts, exempt_counts = capped.snapshot(), exempt.snapshot()
        serving = r.counts().serving
        print(f"capped {counts}, exempt {exempt_counts}; payload streams {opened}, serving {serving}")
        assert counts == {"received": CAP, "origin_cap": SENDERS - CAP + 1}, counts
        assert len({holder for _, holder in taken[notices.NOTICE_STREAM]}) == CAP
        assert exempt_counts == {"received": SENDERS + 1}, exempt_counts
        # 8 streams admitted (and closed for want of a request), the rest refused for their origin
        assert serving.origin_cap == opened - MAX_OPEN_STREAMS_PER_ORIGIN > 0, serving
        assert serving.bad_request == MAX_OPEN_STREAMS_PER_ORIGIN, serving
    finally:
        r.shutdown()
