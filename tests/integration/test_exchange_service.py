"""The swarm's data plane between real nodes in this process (real hivemind DHTs and libp2p streams on
127.0.0.1, real signed batches of real scored reasoning-gym groups): a peer that accepts payload streams
and never answers does not hold up the others' batches (issue #15, acceptance 3); a batch is pulled from
a holder when its author refuses us; the notice handler's bounds against a real libp2p sender."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from types import SimpleNamespace

import pytest

from benchmarks.harness.processes import read_jsonl
from benchmarks.harness.waiting import wait_until
from swarmnode.config import SwarmConfig
from swarmnode.identity import Identity
from swarmnode.swarm.exchange.records import SHARE_TRACE_ENV
from swarmnode.swarm.exchange.swarm import Swarm
from swarmnode.swarm.net import notices
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire import codec, dht_rules, framing, limits
from tests.helpers.inprocess_swarm import make_swarm
from tests.helpers.verify_world import Peer

SWARM = "it-exchange-service"
DEADLINE_S = 8.0
ARRIVAL_LIMIT_S = 3.0  # an honest batch reaches a peer this soon after its publish, silent peer or not
SILENT_HOLD_S = 60.0  # the silent peer keeps a pull's stream open this long without answering


def _node(tmp_path, name: str, initial_peers: list[str]) -> Swarm:
    node = make_swarm(tmp_path, name, initial_peers, SWARM, share_deadline_s=DEADLINE_S)
    node.sender = Peer(node.identity, node.verifier.bank)  # makes real scored groups as this node
    return node


async def _never_answer(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A payload handler that reads the pull request and then holds the stream open, silent."""
    await reader.readexactly(framing.PULL_REQUEST_BYTES)
    with contextlib.suppress(asyncio.CancelledError):  # the transport's shutdown ends it
        await asyncio.sleep(SILENT_HOLD_S)


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """Receiver ``a`` (bootstrap), silent ``s``, honest ``b`` and ``c``; every roster complete."""
    tmp_path = tmp_path_factory.mktemp("exchange-service")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SHARE_TRACE_ENV, "1")
        nodes: dict[str, Swarm] = {}
        try:
            nodes["a"] = _node(tmp_path, "a", [])
            addrs = nodes["a"].start()
            for name in ("s", "b", "c"):
                nodes[name] = _node(tmp_path, name, addrs[:1])
            # before start: served from start
            nodes["s"].transport.serve(framing.PAYLOAD_STREAM, _never_answer)
            for name in ("s", "b", "c"):
                nodes[name].start()
            ids = {name: node.identity.peer_id for name, node in nodes.items()}
            for name, node in nodes.items():
                others = {pid for other, pid in ids.items() if other != name}
                assert wait_until(lambda n=node, o=others: n.service.refresh_roster() >= o, 60, 0.1), name
            time.sleep(2.5)  # every exchange service has read the full roster too
            yield SimpleNamespace(ids=ids, **nodes)
        finally:
            for node in reversed(list(nodes.values())):
                node.shutdown()


def test_a_silent_peer_does_not_hold_up_the_other_peers_batches(swarm):
    """Acceptance 3: ``s`` announces a batch and never answers its pull; ``b`` and ``c`` publish a second
    into ``a``'s exchange. Their batches reach ``a`` within ARRIVAL_LIMIT_S of their publish (from a's
    share trace), not after the silent pull's timeout."""
    a, s, b, c = swarm.a, swarm.s, swarm.b, swarm.c
    s.publish(1, 0, s.sender.groups())
    time.sleep(0.5)  # its announcement is out before a's exchange starts: the first pull is the silent one
    exchanged = threading.Thread(target=a.exchange, args=(1, 0, a.sender.groups()), daemon=True)
    exchanged.start()
    time.sleep(1.0)
    published = {}
    for node in (b, c):
        published[node.identity.peer_id] = time.time()
        node.publish(1, 0, node.sender.groups())
    exchanged.join(DEADLINE_S + 15)
    assert not exchanged.is_alive()

    def arrivals() -> dict[str, dict]:
        events = read_jsonl(a.run_dir / "share.jsonl")
        return {e["peer"]: e for e in events if e["event"] == "batch" and "error" not in e}

    # bounded: the old exchange never pulls them
    wait_until(lambda: set(published) <= set(arrivals()), 5.0, 0.1)
    got = arrivals()
    for peer, at in published.items():
        assert peer in got, f"{peer[-6:]}'s batch never reached a: {read_jsonl(a.run_dir / 'share.jsonl')}"
        assert got[peer]["fetched"] - at < ARRIVAL_LIMIT_S, got[peer]
    assert swarm.ids["s"] not in got  # the silent peer's batch never came
    exchange = [e for e in read_jsonl(a.run_dir / "share.jsonl") if e["event"] == "exchange"][-1]
    assert exchange["ended"] - exchange["started"] <= DEADLINE_S + 2.0  # publishing + the deadline, no more


def test_a_batch_comes_from_a_holder_when_its_author_refuses_us(swarm):
    """``b`` authors a batch but refuses ``c``'s streams (as if c could not reach it); ``a`` pulls and
    verifies it, then tells ``c`` it holds it (notify_one): ``c`` pulls it from ``a`` and checks b's
    signature."""
    a, b, c = swarm.a, swarm.b, swarm.c
    b_id, c_id = swarm.ids["b"], swarm.ids["c"]
    before = a.arrivals.snapshot().counters.batches_received
    c.book.credit_trained(b_id)  # c trained on b's groups before: an author with standing, retried elsewhere
    b.transport.payloads.set_peer_filter(lambda peer: peer != c_id)
    try:
        b.publish(2, 0, b.sender.groups())
        assert wait_until(lambda: a.arrivals.snapshot().counters.batches_received > before, 10, 0.1)
        record = a.transport.records.get(dht_rules.announce_key(SWARM, b_id))[b_id]
        digest = codec.decode_message(record, swarm_id=SWARM)[0].payload_sha256
        notices.notify_one(a.transport, c_id, b_id, record)

        def from_holder() -> list[dict]:
            events = read_jsonl(c.run_dir / "share.jsonl")
            return [e for e in events if e["event"] == "batch" and e["peer"] == b_id and e["round"] == 2]

        assert wait_until(lambda: any("error" not in e for e in from_holder()), 15, 0.1), from_holder()
    finally:
        b.transport.payloads.set_peer_filter(lambda peer: not b.book.is_banned(peer))
    served = [e for e in from_holder() if "error" not in e]
    assert served[0]["holder"] == swarm.ids["a"] and served[0]["groups"] > 0
    assert any(e["holder"] == b_id and e["error"] == "closed" for e in from_holder())  # b refused first
    assert c.verifier.already_accepted(digest)


def _send_raw(sender: Transport, peer_id: str, chunks: list[bytes]) -> None:
    """Open a notice stream to ``peer_id``, write ``chunks``, wait for the receiver to close it."""
    from hivemind.p2p import PeerID

    async def job(p2p) -> None:
        _, reader, writer = await p2p.call_binary_stream_handler(
            PeerID.from_base58(peer_id), notices.NOTICE_STREAM
        )
        with contextlib.suppress(ConnectionError):  # a refused stream is closed while we write
            for chunk in chunks:
                writer.write(chunk)
            await writer.drain()
            await asyncio.wait_for(reader.read(1), notices.NOTICE_READ_TIMEOUT_S + 3)
        writer.close()

    sender.submit(job).result(notices.NOTICE_READ_TIMEOUT_S + 5)


def test_notice_bounds_against_a_real_sender(tmp_path):
    """Oversize, malformed, silent and flooding notices from a real libp2p peer are refused and counted;
    a full queue is counted; the handler never blocks the transport's loop (a payload pull still works)."""
    keys = {}
    for name in ("r", "x"):
        keys[name] = tmp_path / f"{name}.key"
        Identity.generate().save(keys[name])
    inbox: queue.Queue = queue.Queue(maxsize=3)  # a bounded queue, like the service's

    def take(record: bytes, author: str, holder: str, card: bytes) -> bool:
        try:
            inbox.put_nowait((record, author, holder, card))
            return True
        except queue.Full:
            return False

    receiver = notices.NoticeReceiver(take, allow=lambda peer: True)
    r = Transport(keys["r"], SwarmConfig())
    r.serve(notices.NOTICE_STREAM, receiver.handle)
    x = None
    try:
        addrs = r.start()
        x = Transport(keys["x"], SwarmConfig(initial_peers=addrs[:1]))
        x.start()
        header = (notices.MAX_NOTICE_BYTES + 1).to_bytes(4, "big")
        _send_raw(x, r.peer_id, [header, b"\0" * 1024])  # the worst case: the body is never read
        _send_raw(x, r.peer_id, [(5).to_bytes(4, "big"), b"\x09abcd"])  # an author id longer than the frame
        _send_raw(x, r.peer_id, [])  # opens and says nothing
        # the largest notice: an announcement and a card of the largest record size each
        frame = notices.encode_notice(
            x.peer_id, b"r" * limits.MAX_RECORD_BYTES, b"c" * limits.MAX_RECORD_BYTES
        )
        for _ in range(notices.NOTICE_BURST + 4):
            _send_raw(x, r.peer_id, [frame])
        counts = receiver.snapshot()
        assert counts["oversize"] == 1 and counts["bad_frame"] == 1 and counts["timeout"] == 1, counts
        assert counts["received"] == 3 and inbox.qsize() == 3, counts  # the queue's bound
        assert counts["queue_full"] >= 1 and counts["rate_limited"] >= 4, counts
        assert sum(counts.values()) == 3 + notices.NOTICE_BURST + 4
        digest = b"\x07" * 32
        r.payloads.offer(digest, b"still serving")
        assert x.fetch(r.peer_id, digest, timeout_s=5) == b"still serving"
    finally:
        if x is not None:
            x.shutdown()
        r.shutdown()
