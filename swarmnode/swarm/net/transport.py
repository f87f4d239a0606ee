"""Moving bytes between peers: small records in the hivemind DHT, payloads over direct libp2p streams.

This module knows nothing about rollouts or verification. It gives the node three things:

- ``records``: small values (<= ``MAX_RECORD_BYTES``) under a DHT key, one subkey per peer
  (``net.dht.DHTRecords``; what the swarm stores where is ``net.dht``).
- ``payloads`` / ``fetch``: payloads served by their 32-byte digest on ``PAYLOAD_STREAM`` (the serving
  half, with its caps and the peer filter, is ``payloads``, a ``net.payloads.PayloadServer``) and the
  client side that pulls one (PROTOCOL.md section 9), with our 4-byte frame header, a hard cap and one
  deadline.
- lifecycle: ``serve`` registers a stream handler (the one way to; before ``start``); ``start`` launches
  the DHT process (it owns p2pd; ``net.daemon``) and a replica of its P2P client here (our streams carry
  our peer id) serving those handlers; ``shutdown`` stops all of it.
- reachability (``swarm.reachability``): with ``auto``, ``start`` asks initial peers to dial this node
  back (reachability.py). If none can, it restarts as a DHT client: peers then never wait on it in
  their routing tables, it reaches out to them, and they pull its payloads over the connections it
  opened (libp2p connections carry streams both ways). Client-mode daemons also look for circuit relays
  (``use_auto_relay``); nodes started ``public`` (bootstrap nodes) offer them.

Start-up problems a user can fix raise TransportError with what to do: a listen port already taken
(checked first: p2pd binds with SO_REUSEPORT, so a second daemon would silently share the port), the
daemon failing to start (its own error), no initial peer answering (each one tried is named), and a
clock too far off the peers' (hivemind allows 3 s).

Threading: hivemind's P2P client is asyncio, the rest of the node synchronous. One event loop runs in a
daemon thread; public methods run coroutines on it with timeouts (``submit``: without waiting); stream
handlers run on it and never block it. Pulls raise ``PeerError`` (the network edge: counted, never fatal).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import faulthandler
import functools
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from swarmnode.config import SwarmConfig
from swarmnode.errors import PeerError, TransportError
from swarmnode.identity import public_key_from_peer_id
from swarmnode.swarm.net import daemon, reachability
from swarmnode.swarm.net.counts import PullCounts, Tally, TransportCounts
from swarmnode.swarm.net.dht import DHTRecords
from swarmnode.swarm.net.payloads import PayloadServer
from swarmnode.swarm.net.streams import open_stream
from swarmnode.swarm.wire.framing import (
    FRAME_HEADER_BYTES,
    PAYLOAD_STREAM,
    PULL_REQUEST_BYTES,
    encode_pull_request,
    parse_frame_header,
)
from swarmnode.swarm.wire.limits import MAX_FRAME_BYTES, ProtocolError

if TYPE_CHECKING:  # hivemind (and torch behind it) is imported on start(), not on import
    import hivemind

logger = logging.getLogger(__name__)
T = TypeVar("T")

FETCH_FAILURE_REASONS = ("timeout", "not_found", "oversize", "unreachable", "closed", "banned", "bad_peer")
# start-up longer than this many start timeouts (a DHT start, a dial-back, a restart in client mode and
# their slack) is a hang: every thread's stack goes to stderr
STARTUP_STACKS_AFTER = 4


class Transport:
    """One node's DHT membership and payload streams. Not usable before ``start`` or after ``shutdown``.

    Serving (``payloads.offer``, the peer filter and standing, the stream handler and its caps) is
    ``payloads``, a ``PayloadServer`` (one with the default caps unless given, its origin rule from
    ``swarm.origin_cap_exempt_loopback``). ``stream_name``
    exists for tests (another protocol id); nodes keep the default. ``must_reach_initial_peers=False``
    (bootstrap nodes) starts even when no initial peer answers.

    After ``start``: ``client_mode`` (whether the DHT runs as a client), ``reachability`` (the dial-back
    verdict, or "unchecked") and ``reachability_note`` (one line for the user saying what was decided).

    ``counts()``: what serving, the DHT calls and this transport's pulls and notices counted, each part
    its own (``net.counts``).
    """

    def __init__(
        self,
        identity_path: Path,
        swarm: SwarmConfig,
        *,
        must_reach_initial_peers: bool = True,
        payloads: PayloadServer | None = None,
        stream_name: str = PAYLOAD_STREAM,
        start_timeout_s: float = 30.0,
        record_timeout_s: float = 10.0,
    ):
        self.payloads = payloads if payloads is not None else PayloadServer()
        self.payloads.exempt_loopback = swarm.origin_cap_exempt_loopback  # serving slots per origin
        self.identity_path = Path(identity_path)
        self.swarm = swarm
        self.must_reach_initial_peers = must_reach_initial_peers
        self.client_mode = False
        self.reachability: str = "unchecked"
        self.reachability_note = ""
        self.stream_name = stream_name
        self.start_timeout_s = start_timeout_s

        self.peer_id: str = ""
        self._pulls = Tally(PullCounts())
        self.records = DHTRecords(lambda: self._dht if self._running() else None, record_timeout_s)

        self._dht: hivemind.DHT | None = None
        self._p2p: Any = None  # hivemind.P2P replica on the DHT's daemon
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._lifecycle_lock = threading.Lock()
        self._handlers: dict[str, Callable[..., Coroutine]] = {stream_name: self.payloads.handle_stream}

    def counts(self) -> TransportCounts:
        return TransportCounts(self.payloads.counts(), self._pulls.read(), self.records.counts())

    def count_notices_sent(self, n: int) -> None:
        """``n`` notices are being sent (``net.notices.notify``; attempted, a send may still fail)."""
        self._pulls.add("notices_sent", n)

    def serve(self, name: str, handler: Callable[..., Coroutine]) -> None:
        """Answer streams of protocol ``name`` with ``handler(info, reader, writer)`` on the transport's
        loop (it must never block it). Before ``start``; a second handler for a name replaces the first."""
        if self._started:
            raise RuntimeError(f"serve({name!r}) after start: stream handlers are registered before it")
        self._handlers[name] = handler

    def start(self) -> list[str]:
        """Start the DHT (and its p2pd), the in-process replica and the payload handler.

        Returns this node's visible multiaddrs, each ending in ``/p2p/<peer id>``. Raises TransportError
        with a message saying what to check when the daemon cannot start or no initial peer answers.
        """
        with self._lifecycle_lock:
            if self._closed:
                raise TransportError("closed", "this transport was shut down; create a new one")
            if self._started:
                raise RuntimeError("Transport.start() called twice")
            identity = daemon.load_identity(self.identity_path)
            initial_peers = daemon.check_initial_peers(self.swarm.initial_peers, identity.peer_id)
            daemon.check_listen_ports(self.swarm.host_maddrs)
            self._started = True
            atexit.register(self.shutdown)
            # every wait below is bounded, but hivemind's are not all ours: if start-up still hangs, the
            # threads' stacks on stderr say where (docs/reliability.md, "Left open")
            daemon.dump_stacks_after(STARTUP_STACKS_AFTER * self.start_timeout_s)
            try:
                mode = self.swarm.reachability
                maddrs = self._start_network(identity.peer_id, initial_peers, client=mode == "private")
                if mode == "auto" and initial_peers:
                    maddrs = self._settle_reachability(identity.peer_id, initial_peers, maddrs)
                elif mode != "auto":
                    self.reachability_note = f"not checked (swarm.reachability={mode})"
                else:
                    self.reachability_note = "not checked (no initial peers: this node starts a new swarm)"
                return maddrs
            except BaseException:
                self._shutdown_locked()
                raise
            finally:
                faulthandler.cancel_dump_traceback_later()

    def _start_network(self, peer_id: str, initial_peers: list[str], *, client: bool) -> list[str]:
        self._dht = daemon.start_dht(
            self.swarm,
            self.identity_path,
            initial_peers,
            client=client,
            must_reach_initial_peers=self.must_reach_initial_peers,
            start_timeout_s=self.start_timeout_s,
        )
        self.client_mode = client
        return self._start_replica(peer_id)

    def _settle_reachability(self, peer_id: str, initial_peers: list[str], maddrs: list[str]) -> list[str]:
        """Dial-back check; restart as a DHT client if peers answered and none could connect."""
        ports = reachability.tcp_ports(maddrs)
        answers: list[bytes | str] = []
        if ports:
            asked = [addr.rsplit("/p2p/", 1)[1] for addr in initial_peers[: reachability.PEERS_ASKED]]
            asking = _gather([reachability.ask(self._p2p, peer, ports) for peer in asked])
            answers = self._call(asking, reachability.ASK_WINDOW_S + 5)
        self.reachability = reachability.verdict(answers)
        if self.reachability == "unreachable":
            logger.info("dial-back failed on TCP port(s) %s; restarting the DHT in client mode", ports)
            self._stop_network()
            maddrs = self._start_network(peer_id, initial_peers, client=True)
        self.reachability_note = reachability.note(self.reachability, answers, ports)
        return maddrs

    def _start_replica(self, expected_peer_id: str) -> list[str]:
        """A P2P client in this process on the DHT's daemon: our streams then carry our peer id."""
        from hivemind import DHT
        from hivemind.p2p import P2P

        assert self._dht is not None
        timeout = self.start_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"transport-{expected_peer_id[-6:]}", daemon=True
        )
        self._thread.start()
        # what DHT.replicate_p2p() does, but with a deadline on asking the DHT process for the socket
        daemon_maddr = self._dht.run_coroutine(DHT._get_p2p_daemon_listen_maddr, return_future=True)
        self._p2p = self._call(P2P.replicate(daemon_maddr.result(timeout)), timeout)
        self.peer_id = self._p2p.peer_id.to_base58()
        if self.peer_id != expected_peer_id:  # the daemon must run on our Ed25519 key, or signatures lie
            raise TransportError(
                "bad_identity", f"p2pd runs as {self.peer_id}, but the identity file is {expected_peer_id}"
            )
        self._handlers.setdefault(reachability.DIALBACK_STREAM, reachability.DialbackServer().handle)
        for name, handler in self._handlers.items():
            self._call(self._p2p.add_binary_stream_handler(name, handler), timeout)
        # if this process dies without shutdown() (kill -9), the DHT process and p2pd must not linger on
        # with our peer id and port: they watch for it and exit
        watch = functools.partial(daemon.exit_with_parent, parent_pid=os.getpid())
        self._dht.run_coroutine(watch, return_future=True).result(timeout)
        maddrs = [str(m) for m in self._call(self._p2p.get_visible_maddrs(latest=True), timeout)]
        logger.info("transport up as %s at %s", self.peer_id, maddrs)
        return maddrs

    def submit(self, job: Callable[[Any], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        """Run ``job(p2p)`` on the loop, not waiting for it (fire-and-forget sends: swarm.notices)."""
        return asyncio.run_coroutine_threadsafe(job(self._p2p), self._loop)  # type: ignore[arg-type]

    def shutdown(self) -> None:
        """Stop the handler, the loop thread, the replica and the DHT process (and its p2pd). Idempotent."""
        with self._lifecycle_lock:
            self._shutdown_locked()

    def _shutdown_locked(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.shutdown)
        self._stop_network()
        self.payloads.clear()

    def _stop_network(self) -> None:
        """Stop the handlers, the loop thread, the replica and the DHT process (and its p2pd)."""
        loop, p2p = self._loop, self._p2p
        if loop is not None and self._thread is not None and self._thread.is_alive():
            if p2p is not None:
                for name in self._handlers:
                    with contextlib.suppress(Exception):
                        self._call(p2p.remove_binary_stream_handler(name), 2.0)
                with contextlib.suppress(Exception):
                    self._call(p2p.shutdown(), 2.0)
            with contextlib.suppress(Exception):
                self._call(_cancel_other_tasks(), 2.0)
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=5.0)
        if loop is not None and not loop.is_running():
            loop.close()
        if self._dht is not None:
            daemon.stop_dht_process(self._dht)
        self._dht = self._p2p = self._loop = self._thread = None

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the transport's loop and wait at most ``timeout`` seconds for its result."""
        if self._loop is None or self._loop.is_closed():
            coro.close()
            raise PeerError("closed", "transport is not running")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("Transport methods must not be called from its own event loop")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def _running(self) -> bool:
        return self._started and not self._closed

    def fetch(
        self, peer_id: str, digest: bytes, *, max_bytes: int = MAX_FRAME_BYTES, timeout_s: float = 10.0
    ) -> bytes:
        """Pull the payload with ``digest`` from ``peer_id``: exactly the bytes it sent, unverified.

        The whole exchange has one deadline. A header over ``max_bytes`` (never more than
        MAX_FRAME_BYTES) is rejected before any of the body is read. Raises PeerError with reason
        timeout / not_found / oversize / unreachable / closed / banned / bad_peer.
        """
        if len(digest) != PULL_REQUEST_BYTES:
            raise ValueError(f"a digest is {PULL_REQUEST_BYTES} bytes")
        max_bytes = min(max_bytes, MAX_FRAME_BYTES)
        try:
            if not self._running():
                raise PeerError("closed", "transport is not running")
            if public_key_from_peer_id(peer_id) is None:
                raise PeerError("bad_peer", f"{peer_id!r} is not an Ed25519 peer id")
            if not self.payloads.allowed(peer_id):
                raise PeerError("banned", f"peer {peer_id} is refused by the peer filter")
            if peer_id == self.peer_id:
                data = self.payloads.local_payload(bytes(digest), max_bytes)
            else:
                coro = self._fetch(peer_id, bytes(digest), max_bytes, timeout_s)
                try:
                    data = self._call(coro, timeout_s + 5.0)  # the coroutine has its own deadline
                except concurrent.futures.TimeoutError:
                    raise PeerError("timeout", f"no answer from {peer_id} in {timeout_s:.1f} s") from None
                except concurrent.futures.CancelledError:
                    raise PeerError("closed", "the transport shut down during the pull") from None
        except PeerError as exc:
            self._pulls.add("fetch_failed", key=exc.reason)
            raise
        self._pulls.add("fetch_ok")
        self._pulls.add("fetch_bytes", len(data))
        return data

    async def _fetch(self, peer_id: str, digest: bytes, max_bytes: int, timeout_s: float) -> bytes:

        writer: asyncio.StreamWriter | None = None

        async def exchange() -> bytes:
            nonlocal writer
            try:
                reader, writer = await open_stream(self._p2p, peer_id, self.stream_name)
            except (TimeoutError, asyncio.CancelledError):
                raise
            except Exception as exc:  # ControlFailure, P2PDaemonError, OSError: no route, no such protocol
                raise PeerError("unreachable", f"cannot open a stream to {peer_id}: {exc}") from None
            writer.write(encode_pull_request(digest))
            await writer.drain()
            header = await reader.readexactly(FRAME_HEADER_BYTES)
            try:
                length = parse_frame_header(header, max_bytes)
            except ProtocolError:
                claimed = int.from_bytes(header, "big")
                raise PeerError(
                    "oversize", f"{peer_id} announced {claimed} bytes; the limit is {max_bytes}"
                ) from None
            if length == 0:
                raise PeerError("not_found", f"{peer_id} does not have that payload (any more)")
            return await reader.readexactly(length)

        try:
            return await asyncio.wait_for(exchange(), timeout_s)
        except PeerError:
            raise
        except TimeoutError:
            await self._drop_connection(peer_id)
            raise PeerError("timeout", f"pull from {peer_id} took over {timeout_s:.1f} s") from None
        except Exception as exc:  # IncompleteReadError, ConnectionResetError, ...: the stream ended early
            raise PeerError("closed", f"{peer_id} closed the stream early ({exc!r})") from None
        finally:
            if writer is not None:
                writer.close()

    async def _drop_connection(self, peer_id: str) -> None:
        """Close the connection to a peer whose pull timed out, so that the next stream dials afresh.

        libp2p carries every stream to a peer over one connection. One that lost packets (a link flap, a
        NAT rebinding) can stay silent long after the path is back: TCP retransmits at doubling intervals
        (up to ~13 s after a 12 s cut, measured), and a connection whose NAT mapping is gone never
        recovers. Best effort: hivemind has no public call for it, so this uses its daemon client."""
        from hivemind.p2p import PeerID

        try:
            await asyncio.wait_for(self._p2p._client.disconnect(PeerID.from_base58(peer_id)), 2.0)
            self._pulls.add("disconnected_after_timeout")
        except Exception as exc:
            logger.debug("disconnecting %s after a timed-out pull failed: %r", peer_id, exc)

    def connected_peers(self) -> set[str]:
        """Peer ids the daemon holds a connection to (best effort: empty if it cannot tell)."""
        if not self._running():
            return set()
        try:
            return {info.peer_id.to_base58() for info in self._call(self._p2p.list_peers(), 5.0)}
        except Exception as exc:
            logger.debug("list_peers failed: %r", exc)
            return set()

    def connected_peer_count(self) -> int:
        return len(self.connected_peers())

    def dht_alive(self) -> bool:
        """Whether the DHT process (and with it p2pd) is running."""
        return self._running() and self._dht is not None and self._dht.is_alive()

    def dht_stats(self, timeout_s: float = 5.0) -> dict[str, int]:
        """``routing_table_peers`` and ``stored_records`` (keys this node stores for the DHT); {} if the
        DHT process does not answer in time."""
        if not self._running():
            return {}
        assert self._dht is not None
        try:
            return self._dht.run_coroutine(daemon.dht_stats, return_future=True).result(timeout_s)
        except Exception as exc:
            logger.debug("dht_stats failed: %r", exc)
            return {}


async def _gather(coros: list[Coroutine[Any, Any, T]]) -> list[T]:
    return list(await asyncio.gather(*coros))


async def _cancel_other_tasks() -> None:
    """Cancel what still runs on the loop (stream handlers, pulls) so the loop can stop cleanly."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=1.0)
