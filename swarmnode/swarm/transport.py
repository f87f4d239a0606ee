"""Moving bytes between peers: small records in the hivemind DHT, payloads over direct libp2p streams.

This module knows nothing about rollouts or verification. It gives the node three things:

- ``put_record`` / ``get_records``: small values (<= ``MAX_RECORD_BYTES``) under a DHT key, one subkey
  per peer. hivemind's DHT worker crashes on values over ~64 KiB, so oversize values never reach it.
- ``offer`` / ``fetch``: a bounded in-memory store of payloads served by their 32-byte digest on
  ``PAYLOAD_STREAM``, and the client side that pulls one (PROTOCOL.md section 9). The daemon's own length
  prefixes have no upper bound, so both sides use our 4-byte frame header, hard caps and deadlines.
- lifecycle: ``start`` launches the DHT process (which owns the p2pd daemon) and a replica of its P2P
  client in this process, so streams come from our own peer id; ``shutdown`` stops all of it.
- reachability (``swarm.reachability``): with ``auto``, ``start`` asks initial peers to dial this node
  back (reachability.py). If none can, it restarts as a DHT client: peers then never wait on it in
  their routing tables, it reaches out to them, and they pull its payloads over the connections it
  opened (libp2p connections carry streams both ways). Client-mode daemons also look for circuit relays
  (``use_auto_relay``); nodes started ``public`` (bootstrap nodes) offer them.

Start-up problems a user can fix raise TransportError with what to do: a listen port already taken
(checked before the daemon starts: p2pd binds with SO_REUSEPORT, so a second daemon on a port would
*not* fail, it would silently share it), the daemon failing to start (its own error), no initial peer
answering (each one tried is named), and a clock too far off the peers' (hivemind allows 3 s).

Threading: hivemind's P2P client is asyncio, the rest of the node is synchronous. One event loop runs in
a daemon thread; public methods submit coroutines to it and wait with timeouts. The stream handler runs
on that loop and never blocks it. Network trouble on the record path is logged and reported as a miss;
payload pulls raise ``TransportError`` with a short ``reason`` that metrics can use as a label.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import errno
import faulthandler
import functools
import logging
import os
import re
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from swarmnode.config import SwarmConfig
from swarmnode.errors import TransportError
from swarmnode.identity import Identity, public_key_from_peer_id
from swarmnode.swarm import reachability
from swarmnode.swarm.protocol import (
    FRAME_HEADER_BYTES,
    MAX_FRAME_BYTES,
    MAX_RECORD_BYTES,
    PAYLOAD_STREAM,
    PULL_REQUEST_BYTES,
    ProtocolError,
    encode_frame_header,
    encode_pull_request,
    parse_frame_header,
    parse_pull_request,
)

if TYPE_CHECKING:  # hivemind (and torch behind it) is imported on start(), not on import
    import hivemind

logger = logging.getLogger(__name__)
T = TypeVar("T")

FETCH_FAILURE_REASONS = ("timeout", "not_found", "oversize", "unreachable", "closed", "banned", "bad_peer")
# every TransportError reason; the start-up ones follow the fetch failures
TRANSPORT_ERROR_REASONS = (
    *FETCH_FAILURE_REASONS, "startup", "bad_identity", "bad_address", "port_taken", "clock_skew",
)  # fmt: skip
CLOCK_TOLERANCE_S = 3.0  # hivemind's MAX_DHT_TIME_DISCREPANCY_SECONDS
RECORD_GET_TIMEOUT_S = 5.0
# start-up longer than this many start timeouts (a DHT start, a dial-back, a restart in client mode and
# their slack) is a hang: every thread's stack goes to stderr
STARTUP_STACKS_AFTER = 4
_CLOCK_RE = re.compile(r"local time must be within .*local: ([0-9.]+), peer: ([0-9.]+)", re.S)

_WRITE_CHUNK = 64 * 1024  # bytes written per drain: bounds each served stream's send buffer
_PARENT_CHECK_PERIOD_S = 1.0


class Transport:
    """One node's DHT membership and payload streams. Not usable before ``start`` or after ``shutdown``.

    Serving is bounded so that no peer can exhaust the node: at most ``max_streams_per_peer`` concurrent
    pulls per remote peer and ``max_streams`` in all (extra streams are closed unanswered), a request
    must arrive within ``request_timeout_s`` and the answer must be taken within ``serve_timeout_s``.
    ``stream_name`` exists for tests (another protocol id); nodes keep the default.
    ``must_reach_initial_peers=False`` (bootstrap nodes) starts even when no initial peer answers.

    After ``start``: ``client_mode`` (whether the DHT runs as a client), ``reachability`` (the dial-back
    verdict, or "unchecked") and ``reachability_note`` (one line for the user saying what was decided).

    ``stats`` (counters for metrics): served / served_bytes (payloads sent), not_found (asked for a
    digest we do not hold), refused (stream closed unanswered: filter or caps), bad_request (no or short
    request in time), aborted (the puller left or was too slow), errors (anything else in the handler),
    fetch_ok / fetch_bytes, fetch_failed_<reason> for each of FETCH_FAILURE_REASONS, and
    disconnected_after_timeout (connections closed after a timed-out pull, to be dialled afresh).
    """

    def __init__(
        self,
        identity_path: Path,
        swarm: SwarmConfig,
        *,
        must_reach_initial_peers: bool = True,
        payload_capacity: int = 64,
        stream_name: str = PAYLOAD_STREAM,
        max_streams_per_peer: int = 4,
        max_streams: int = 64,
        request_timeout_s: float = 5.0,
        serve_timeout_s: float = 30.0,
        start_timeout_s: float = 30.0,
        record_timeout_s: float = 10.0,
    ):
        if payload_capacity < 1:
            raise ValueError("payload_capacity must be >= 1")
        self.identity_path = Path(identity_path)
        self.swarm = swarm
        self.must_reach_initial_peers = must_reach_initial_peers
        self.client_mode = False
        self.reachability: str = "unchecked"
        self.reachability_note = ""
        self.payload_capacity = payload_capacity
        self.stream_name = stream_name
        self.max_streams_per_peer = max_streams_per_peer
        self.max_streams = max_streams
        self.request_timeout_s = request_timeout_s
        self.serve_timeout_s = serve_timeout_s
        self.start_timeout_s = start_timeout_s
        self.record_timeout_s = record_timeout_s

        self.peer_id: str = ""
        counters = ("served", "served_bytes", "not_found", "refused", "bad_request", "aborted", "errors")
        fetch_counters = ("fetch_ok", "fetch_bytes", "disconnected_after_timeout")
        self.stats: dict[str, int] = dict.fromkeys((*counters, *fetch_counters), 0)
        self.stats.update({f"fetch_failed_{reason}": 0 for reason in FETCH_FAILURE_REASONS})

        self._payloads: OrderedDict[bytes, bytes] = OrderedDict()
        self._payloads_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._allow: Callable[[str], bool] = lambda _peer: True
        self._active: dict[str, int] = {}  # remote peer id -> payload streams being served (loop thread only)
        self._active_total = 0
        self._record_trouble_logged = False

        self._dht: hivemind.DHT | None = None
        self._p2p: Any = None  # hivemind.P2P replica on the DHT's daemon
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._lifecycle_lock = threading.Lock()

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------
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
            identity = self._check_identity()
            initial_peers = self._check_initial_peers(identity.peer_id)
            _check_listen_ports(self.swarm.host_maddrs)
            self._started = True
            atexit.register(self.shutdown)
            # every wait below is bounded, but hivemind's are not all ours: if start-up still hangs, the
            # threads' stacks on stderr say where (a start-up hang under load 20 was never explained)
            _dump_stacks_after(STARTUP_STACKS_AFTER * self.start_timeout_s)
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
        self._dht = self._start_dht(initial_peers, client)
        self.client_mode = client
        return self._start_replica(peer_id)

    def _settle_reachability(self, peer_id: str, initial_peers: list[str], maddrs: list[str]) -> list[str]:
        """Dial-back check; restart as a DHT client if peers answered and none could connect."""
        ports = reachability.tcp_ports(maddrs)
        answers: list[bytes | None] = []
        if ports:
            asked = [addr.rsplit("/p2p/", 1)[1] for addr in initial_peers[: reachability.PEERS_ASKED]]
            timeout = 2 * reachability.DIAL_TIMEOUT_S
            answers = self._call(
                _gather([reachability.ask(self._p2p, peer, ports, timeout) for peer in asked]), timeout + 5
            )
        self.reachability = reachability.verdict(answers)
        answered = sum(1 for answer in answers if answer)
        port_list = ", ".join(map(str, ports))
        if self.reachability == "reachable":
            self.reachability_note = f"peers can open connections to this node ({answered} checked)"
        elif self.reachability == "unknown":
            self.reachability_note = (
                "not checked: no initial peer answered the dial-back check; running as a full DHT node"
            )
        else:
            logger.info("dial-back failed on TCP port(s) %s; restarting the DHT in client mode", port_list)
            self._stop_network()
            maddrs = self._start_network(peer_id, initial_peers, client=True)
            self.reachability_note = (
                f"{answered} peer(s) could not open a connection to this node on TCP port(s) {port_list}, "
                "so it runs in client mode: it connects out to peers and they pull its rollouts over "
                "those connections (relays are used where peers offer them). To serve fully, give it a "
                "fixed port, allow or forward that port in your firewall/router, and pass "
                "--announce /ip4/<your public IP>/tcp/<port>"
            )
        return maddrs

    def _check_identity(self) -> Identity:
        # hivemind would silently generate an RSA key at a missing path: refuse instead
        try:
            return Identity.load(self.identity_path)
        except FileNotFoundError:
            raise TransportError(
                "bad_identity",
                f"identity file {str(self.identity_path)!r} does not exist; create it with "
                "`swarmnode keygen`",
            ) from None
        except (OSError, ValueError) as exc:
            raise TransportError("bad_identity", str(exc)) from None

    def _check_initial_peers(self, own_peer_id: str) -> list[str]:
        from hivemind.utils.multiaddr import Multiaddr

        peers = []
        for addr in self.swarm.initial_peers:
            try:
                peer = Multiaddr(addr)["p2p"]
            except Exception:
                raise TransportError(
                    "bad_address",
                    f"initial peer {addr!r} is not a full multiaddr; expected something like "
                    "/ip4/1.2.3.4/tcp/31337/p2p/12D3KooW... (copy it from the other node's startup log)",
                ) from None
            if peer != own_peer_id:  # a config that lists this node itself (e.g. a shared bootstrap list)
                peers.append(addr)
        if self.swarm.initial_peers and not peers:
            logger.info("all initial peers are this node itself; starting a new swarm")
        return peers

    def _start_dht(self, initial_peers: list[str], client: bool) -> hivemind.DHT:
        import hivemind

        kwargs: dict[str, Any] = {}
        if self.swarm.announce_maddrs:
            kwargs["announce_maddrs"] = list(self.swarm.announce_maddrs)
        if client:  # look for relays at once instead of waiting for AutoNAT to call this node private
            kwargs.update(use_auto_relay=True, force_reachability="private")
        elif self.swarm.reachability == "public":  # go-libp2p serves as a relay only when public
            kwargs["force_reachability"] = "public"
        if not self.must_reach_initial_peers:
            kwargs["ensure_bootstrap_success"] = False
        started = time.monotonic()
        connect_shared_memory_manager()
        dht = hivemind.DHT(
            initial_peers=initial_peers or None,
            host_maddrs=list(self.swarm.host_maddrs),
            identity_path=str(self.identity_path),
            client_mode=client,
            # hivemind's "is this identity taken" probe only parses RSA keys; ours are Ed25519
            check_if_identity_free=False,
            start=True,
            await_ready=False,
            **kwargs,
        )
        try:
            dht.wait_until_ready(timeout=self.start_timeout_s)
        except BaseException as exc:
            _stop_dht_process(dht)
            raise self._startup_error(exc, initial_peers) from None
        logger.info("DHT up in %.2f s", time.monotonic() - started)
        return dht

    def _startup_error(self, exc: BaseException, initial_peers: list[str]) -> TransportError:
        text = str(exc) or type(exc).__name__
        clock = _CLOCK_RE.search(text)
        if clock:
            offset = float(clock.group(1)) - float(clock.group(2))
            return TransportError(
                "clock_skew",
                f"this machine's clock is {abs(offset):.1f} s {'ahead of' if offset > 0 else 'behind'} an "
                f"initial peer's, and the DHT allows {CLOCK_TOLERANCE_S:.0f} s. Turn on time sync "
                "(`timedatectl set-ntp true`, or install chrony) and start again.",
            )
        if initial_peers and ("bootstrap" in text or isinstance(exc, concurrent.futures.TimeoutError)):
            tried = ", ".join(initial_peers)
            return TransportError(
                "unreachable",
                f"none of the initial peers answered (tried: {tried}). Check that those nodes are running, "
                "that each address and port is right and reachable from this machine (firewall, NAT), and "
                f"that the /p2p/ part is the node's current peer id. ({text.strip()})",
            )
        if isinstance(exc, concurrent.futures.TimeoutError):
            text = f"no answer within {self.start_timeout_s:.0f} s"
        return TransportError(
            "startup",
            f"the libp2p daemon (p2pd) did not start: {text.strip()}. Check that host_maddrs "
            f"{list(self.swarm.host_maddrs)} are valid addresses of this machine and the ports are free.",
        )

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
        self._call(self._p2p.add_binary_stream_handler(self.stream_name, self._handle_stream), timeout)
        dialback = reachability.DialbackServer().handle
        self._call(self._p2p.add_binary_stream_handler(reachability.DIALBACK_STREAM, dialback), timeout)
        # if this process dies without shutdown() (kill -9), the DHT process and p2pd must not linger on
        # with our peer id and port: they watch for it and exit
        watch = functools.partial(_exit_with_parent, parent_pid=os.getpid())
        self._dht.run_coroutine(watch, return_future=True).result(timeout)
        maddrs = [str(m) for m in self._call(self._p2p.get_visible_maddrs(latest=True), timeout)]
        logger.info("transport up as %s at %s", self.peer_id, maddrs)
        return maddrs

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
        with self._payloads_lock:
            self._payloads.clear()

    def _stop_network(self) -> None:
        """Stop the handlers, the loop thread, the replica and the DHT process (and its p2pd)."""
        loop, p2p = self._loop, self._p2p
        if loop is not None and self._thread is not None and self._thread.is_alive():
            if p2p is not None:
                for name in (self.stream_name, reachability.DIALBACK_STREAM):
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
            _stop_dht_process(self._dht)
        self._dht = self._p2p = self._loop = self._thread = None

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the transport's loop and wait at most ``timeout`` seconds for its result."""
        if self._loop is None or self._loop.is_closed():
            coro.close()
            raise TransportError("closed", "transport is not running")
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

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:  # pulls run on caller threads, serving on the loop thread
            self.stats[key] = self.stats.get(key, 0) + n

    # ------------------------------------------------------------------------------------------
    # DHT records
    # ------------------------------------------------------------------------------------------
    def put_record(
        self, key: str, subkey: str, value: bytes, ttl_s: float, timeout_s: float | None = None
    ) -> bool:
        """Store ``value`` under (key, subkey) for ``ttl_s`` seconds. False if the DHT did not take it
        within ``timeout_s`` (at most ``record_timeout_s``, the default).

        Raises TransportError("oversize") for a value over MAX_RECORD_BYTES: hivemind's DHT worker
        process dies on large values, so they are refused here, before they reach it.
        """
        if not isinstance(value, bytes | bytearray):
            raise TypeError("a record value is bytes")
        if len(value) > MAX_RECORD_BYTES:
            raise TransportError("oversize", f"record of {len(value)} bytes; the limit is {MAX_RECORD_BYTES}")
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        if not self._running():
            logger.warning("put_record(%r) on a transport that is not running", key)
            return False
        from hivemind.utils import get_dht_time

        assert self._dht is not None
        try:
            future = self._dht.store(
                key,
                bytes(value),
                expiration_time=get_dht_time() + ttl_s,
                subkey=subkey,
                return_future=True,
            )
            try:
                timeout = (
                    self.record_timeout_s if timeout_s is None else min(timeout_s, self.record_timeout_s)
                )
                ok = bool(future.result(timeout=timeout))
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise
        except Exception as exc:
            self._record_trouble(f"DHT store of {key!r} failed: {exc!r}")
            return False
        self._record_trouble_logged = False
        return ok

    def get_records(self, key: str, timeout_s: float | None = None) -> dict[str, bytes]:
        """All live (subkey -> value) pairs under ``key``; {} on a miss, any network trouble, or no answer
        within ``timeout_s`` (default ``RECORD_GET_TIMEOUT_S``).

        Entries whose subkey is not a str or whose value is not bytes of at most MAX_RECORD_BYTES are
        dropped: any node can write any subkey, so what comes back is untrusted.
        """
        if not self._running():
            return {}
        assert self._dht is not None
        try:
            future = self._dht.get(key, latest=True, return_future=True)
            try:
                found = future.result(timeout=RECORD_GET_TIMEOUT_S if timeout_s is None else timeout_s)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise
        except Exception as exc:
            self._record_trouble(f"DHT get of {key!r} failed: {exc!r}")
            return {}
        self._record_trouble_logged = False
        if found is None or not isinstance(found.value, dict):
            return {}
        records = {}
        for subkey, item in found.value.items():
            value = getattr(item, "value", None)
            if isinstance(subkey, str) and isinstance(value, bytes) and len(value) <= MAX_RECORD_BYTES:
                records[subkey] = value
        return records

    def _record_trouble(self, message: str) -> None:
        """Warn once per outage; repeats go to debug so a flaky network does not flood the log."""
        if self._record_trouble_logged:
            logger.debug(message)
        else:
            logger.warning("%s (further DHT errors are logged at debug level until one succeeds)", message)
            self._record_trouble_logged = True

    # ------------------------------------------------------------------------------------------
    # payloads: serving side
    # ------------------------------------------------------------------------------------------
    def offer(self, digest: bytes, data: bytes) -> None:
        """Serve ``data`` to peers that ask for ``digest``; past payload_capacity the oldest offer goes."""
        if len(digest) != PULL_REQUEST_BYTES:
            raise ValueError(f"a digest is {PULL_REQUEST_BYTES} bytes")
        if not 0 < len(data) <= MAX_FRAME_BYTES:
            raise TransportError("oversize", f"payload of {len(data)} bytes; it must be 1..{MAX_FRAME_BYTES}")
        with self._payloads_lock:
            self._payloads[bytes(digest)] = bytes(data)
            self._payloads.move_to_end(bytes(digest))
            while len(self._payloads) > self.payload_capacity:
                self._payloads.popitem(last=False)

    def set_peer_filter(self, allow: Callable[[str], bool]) -> None:
        """``allow(peer_id)`` is asked for every incoming stream and before every fetch (ban lists)."""
        self._allow = allow

    def _allowed(self, peer_id: str) -> bool:
        try:
            return bool(self._allow(peer_id))
        except Exception:
            logger.exception("peer filter raised for %s; refusing the peer", peer_id)
            return False

    async def _handle_stream(
        self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One pull: read a 32-byte digest, answer with a frame. Every failure is counted, none escapes."""
        peer = "?"
        counted = False
        try:
            peer = info.peer_id.to_base58()
            if (
                self._active_total >= self.max_streams
                or self._active.get(peer, 0) >= self.max_streams_per_peer
            ):
                self._count("refused")
                return
            if not self._allowed(peer):
                self._count("refused")
                return
            self._active[peer] = self._active.get(peer, 0) + 1
            self._active_total += 1
            counted = True
            try:
                request = await asyncio.wait_for(
                    reader.readexactly(PULL_REQUEST_BYTES), self.request_timeout_s
                )
                digest = parse_pull_request(request)
            except (TimeoutError, asyncio.IncompleteReadError, ProtocolError, ConnectionError):
                self._count("bad_request")
                return
            try:
                await asyncio.wait_for(self._send_payload(writer, digest), self.serve_timeout_s)
            except (TimeoutError, ConnectionError):  # too slow a reader, or it hung up
                self._count("aborted")
        except asyncio.CancelledError:  # shutdown
            raise
        except Exception as exc:  # a misbehaving client must never take the node down
            self._count("errors")
            logger.debug("payload stream from %s failed: %r", peer, exc)
        finally:
            if counted:
                self._active_total -= 1
                left = self._active.get(peer, 1) - 1
                if left > 0:
                    self._active[peer] = left
                else:
                    self._active.pop(peer, None)
            with contextlib.suppress(Exception):
                writer.close()

    async def _send_payload(self, writer: asyncio.StreamWriter, digest: bytes) -> None:
        """Write the frame for ``digest`` (length 0 when we do not have it), draining per chunk."""
        with self._payloads_lock:
            data = self._payloads.get(digest)
        if data is None:
            self._count("not_found")
            writer.write(encode_frame_header(0))
            await writer.drain()
            return
        writer.write(encode_frame_header(len(data)))
        view = memoryview(data)
        for offset in range(0, len(data), _WRITE_CHUNK):
            writer.write(view[offset : offset + _WRITE_CHUNK])
            await writer.drain()
        self._count("served")
        self._count("served_bytes", len(data))

    # ------------------------------------------------------------------------------------------
    # payloads: pulling side
    # ------------------------------------------------------------------------------------------
    def fetch(
        self, peer_id: str, digest: bytes, *, max_bytes: int = MAX_FRAME_BYTES, timeout_s: float = 10.0
    ) -> bytes:
        """Pull the payload with ``digest`` from ``peer_id``: exactly the bytes it sent, unverified.

        The whole exchange has one deadline. A header over ``max_bytes`` (never more than
        MAX_FRAME_BYTES) is rejected before any of the body is read. Raises TransportError with reason
        timeout / not_found / oversize / unreachable / closed / banned / bad_peer.
        """
        if len(digest) != PULL_REQUEST_BYTES:
            raise ValueError(f"a digest is {PULL_REQUEST_BYTES} bytes")
        max_bytes = min(max_bytes, MAX_FRAME_BYTES)
        try:
            if not self._running():
                raise TransportError("closed", "transport is not running")
            if public_key_from_peer_id(peer_id) is None:
                raise TransportError("bad_peer", f"{peer_id!r} is not an Ed25519 peer id")
            if not self._allowed(peer_id):
                raise TransportError("banned", f"peer {peer_id} is refused by the peer filter")
            if peer_id == self.peer_id:
                data = self._local_payload(bytes(digest), max_bytes)
            else:
                coro = self._fetch(peer_id, bytes(digest), max_bytes, timeout_s)
                try:
                    data = self._call(coro, timeout_s + 5.0)  # the coroutine has its own deadline
                except concurrent.futures.TimeoutError:
                    raise TransportError(
                        "timeout", f"no answer from {peer_id} in {timeout_s:.1f} s"
                    ) from None
                except concurrent.futures.CancelledError:
                    raise TransportError("closed", "the transport shut down during the pull") from None
        except TransportError as exc:
            self._count(f"fetch_failed_{exc.reason}")
            raise
        self._count("fetch_ok")
        self._count("fetch_bytes", len(data))
        return data

    def _local_payload(self, digest: bytes, max_bytes: int) -> bytes:
        with self._payloads_lock:
            data = self._payloads.get(digest)
        if data is None:
            raise TransportError("not_found", "this node does not offer that payload")
        if len(data) > max_bytes:
            raise TransportError("oversize", f"payload of {len(data)} bytes; the limit is {max_bytes}")
        return data

    async def _fetch(self, peer_id: str, digest: bytes, max_bytes: int, timeout_s: float) -> bytes:
        from hivemind.p2p import PeerID

        writer: asyncio.StreamWriter | None = None

        async def exchange() -> bytes:
            nonlocal writer
            try:
                _, reader, writer = await self._p2p.call_binary_stream_handler(
                    PeerID.from_base58(peer_id), self.stream_name
                )
            except (TimeoutError, asyncio.CancelledError):
                raise
            except Exception as exc:  # ControlFailure, P2PDaemonError, OSError: no route, no such protocol
                raise TransportError("unreachable", f"cannot open a stream to {peer_id}: {exc}") from None
            writer.write(encode_pull_request(digest))
            await writer.drain()
            header = await reader.readexactly(FRAME_HEADER_BYTES)
            try:
                length = parse_frame_header(header, max_bytes)
            except ProtocolError:
                claimed = int.from_bytes(header, "big")
                raise TransportError(
                    "oversize", f"{peer_id} announced {claimed} bytes; the limit is {max_bytes}"
                ) from None
            if length == 0:
                raise TransportError("not_found", f"{peer_id} does not have that payload (any more)")
            return await reader.readexactly(length)

        try:
            return await asyncio.wait_for(exchange(), timeout_s)
        except TransportError:
            raise
        except TimeoutError:
            await self._drop_connection(peer_id)
            raise TransportError("timeout", f"pull from {peer_id} took over {timeout_s:.1f} s") from None
        except Exception as exc:  # IncompleteReadError, ConnectionResetError, ...: the stream ended early
            raise TransportError("closed", f"{peer_id} closed the stream early ({exc!r})") from None
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
            self._count("disconnected_after_timeout")
        except Exception as exc:
            logger.debug("disconnecting %s after a timed-out pull failed: %r", peer_id, exc)

    # ------------------------------------------------------------------------------------------
    # observation
    # ------------------------------------------------------------------------------------------
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

    def dht_stats(self, timeout_s: float = 5.0) -> dict[str, int]:
        """``routing_table_peers`` and ``stored_records`` (keys this node stores for the DHT); {} if the
        DHT process does not answer in time."""
        if not self._running():
            return {}
        assert self._dht is not None
        try:
            return self._dht.run_coroutine(_dht_stats, return_future=True).result(timeout_s)
        except Exception as exc:
            logger.debug("dht_stats failed: %r", exc)
            return {}


async def _dht_stats(_dht: Any, node: Any) -> dict[str, int]:
    """Runs inside the DHT process."""
    return {
        "routing_table_peers": len(node.protocol.routing_table.uid_to_peer_id),
        "stored_records": len(node.protocol.storage),
    }


async def _gather(coros: list[Coroutine[Any, Any, T]]) -> list[T]:
    return list(await asyncio.gather(*coros))


def _check_listen_ports(host_maddrs: list[str]) -> None:
    """Bind each fixed TCP port of ``host_maddrs`` briefly: a taken port or a foreign IP fails here."""
    for maddr in host_maddrs:
        parts = maddr.strip("/").split("/")
        if len(parts) < 4 or parts[0] not in ("ip4", "ip6") or parts[2] != "tcp" or parts[3] == "0":
            continue
        host, port = parts[1], int(parts[3])
        family = socket.AF_INET6 if parts[0] == "ip6" else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            # SO_REUSEADDR: a previous run's connections in TIME_WAIT do not count as taken; a listener does
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
                sock.listen(1)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise TransportError(
                        "port_taken",
                        f"TCP port {port} on {host} is already in use, by another node or program "
                        f"(`ss -ltnp 'sport = :{port}'` shows which). Stop it, choose another port, or "
                        "listen on port 0 (any free port) in swarm.host_maddrs.",
                    ) from None
                raise TransportError(
                    "startup",
                    f"cannot listen on {maddr}: {exc.strerror}. Is {host} an address of this machine?",
                ) from None


def _dump_stacks_after(seconds: float) -> None:
    """Arm faulthandler's watchdog on stderr, or on the real one where sys.stderr has no file descriptor
    (pytest's capture, notebooks); without either, start-up runs unwatched."""
    for stream in (sys.stderr, sys.__stderr__):
        if stream is None:
            continue
        try:
            faulthandler.dump_traceback_later(seconds, file=stream)
            return
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: no fileno()
            continue


def connect_shared_memory_manager(attempts: int = 3) -> None:
    """Connect this process to torch's shared-memory manager before ``hivemind.DHT()`` needs it.

    hivemind keeps its futures' state in shared memory with torch's ``file_system`` strategy, whose first
    allocation starts ``torch_shm_manager``. The manager exits when no process has connected to it within
    2 s, so on a starved machine the allocation in ``hivemind.DHT()`` failed with a bare "No such file or
    directory" (the manager's socket was gone; a node restarted at load 19 died of it). A new attempt
    starts a new manager, and once connected the process keeps its connection for good.
    """
    import torch
    import torch.multiprocessing

    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        return  # hivemind.utils.mpfuture sets file_system unless HIVEMIND_MEMORY_SHARING_STRATEGY says not
    for attempt in range(1, attempts + 1):
        try:
            torch.empty(1, dtype=torch.uint8).share_memory_()
            return
        except RuntimeError as exc:
            if attempt == attempts:
                raise
            logger.warning(
                "torch's shared-memory manager was gone before this process connected (%s); "
                "starting a new one",
                exc,
            )


def _stop_dht_process(dht: hivemind.DHT) -> None:
    """Ask the DHT process to shut down (it stops its p2pd); terminate it if it does not within 5 s."""
    with contextlib.suppress(Exception):
        if dht.is_alive():
            dht.shutdown()
    with contextlib.suppress(Exception):
        dht.join(timeout=5.0)
        if dht.is_alive():
            dht.terminate()
            dht.join(timeout=2.0)


async def _cancel_other_tasks() -> None:
    """Cancel what still runs on the loop (stream handlers, pulls) so the loop can stop cleanly."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=1.0)


async def _exit_with_parent(_dht: Any, node: Any, *, parent_pid: int) -> None:
    """Runs inside the DHT process: once the node process is gone (kill -9), stop p2pd and exit.

    hivemind's DHT process does not watch its parent, so without this a killed node leaves its DHT
    process and p2pd running with the node's peer id and port, and a restart cannot take them back.
    """

    async def watch() -> None:
        while node.is_alive:  # ends with the DHT node
            if os.getppid() != parent_pid:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(node.shutdown(), 5.0)
                os._exit(0)
            await asyncio.sleep(_PARENT_CHECK_PERIOD_S)

    # keep a reference on the node so the task is not garbage-collected while it runs
    node._swarmnode_parent_watch = asyncio.create_task(watch())
