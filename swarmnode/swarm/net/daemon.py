"""The DHT process and its p2pd: starting, stopping and watching them (what ``Transport`` sits on).

hivemind runs the DHT in a child process that owns the go-libp2p daemon (p2pd). This module checks what
start-up needs (``load_identity``, ``check_initial_peers``), starts the process (``start_dht``: options,
a deadline, and an error a user can act on), stops it (``stop_dht_process``), makes it exit when the
node process dies (``exit_with_parent``, run inside it), reads its stats (``dht_stats``, run inside it),
and holds the process-level plumbing around it: the listen-port check that runs before p2pd binds
(``check_listen_ports``), torch's shared-memory manager that hivemind's futures need
(``connect_shared_memory_manager``) and the start-up watchdog (``dump_stacks_after``).

Circuit relays (libp2p relay v2) let two nodes that cannot be dialled reach each other through one that
can. Measured in network namespaces (docs/operators.md): it works with hivemind 1.1.12's p2pd when the
relay runs ``force_reachability="public"``, the NATed node runs ``use_auto_relay`` with the relay as a
*static* relay, and the relay's address is a public one. hivemind cannot ask p2pd for static relays (it
never passes ``-relayDiscovery=0``): with discovery on, go-libp2p's autorelay waits for four candidates
or three minutes before it reserves a slot, so a node behind NAT is unreachable for its first minutes.
``relay_policy_args`` adds that flag, and the relay-service limits below, to the daemon's command line.

The node sends each request to the DHT process as one pickled message over a pipe (hivemind's
``DHT._outer_pipe``). hivemind registers the pipe's reading end with uvloop, which makes it non-blocking, and
reads a message with ``Connection.recv``: a message that is not all in the pipe yet (one over the pipe's 64
KiB, or over 16 KiB, which Python writes as two writes) failed with ``[Errno 11] Resource temporarily
unavailable`` halfway, the next read started inside it (``EOFError``), and the process died or stopped
answering (a read of ~510 announcement keys; docs/reliability.md). hivemind also sends from whichever thread
calls, without a lock, so two threads' messages could interleave. ``guard_request_pipe`` makes the reading end
blocking again inside the DHT process (a message is read whole; its writer is already writing it) and
serialises the node's sends. ``AbandonedCallFilter`` keeps the DHT process from logging a traceback for every
call the node gave up on at its deadline."""

from __future__ import annotations

import asyncio
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmnode.config import SwarmConfig
from swarmnode.errors import TransportError
from swarmnode.identity import Identity
from swarmnode.swarm.wire.dht_rules import RECORD_CLOCK_TOLERANCE_S
from swarmnode.swarm.wire.limits import MAX_RECORD_BYTES

if TYPE_CHECKING:  # hivemind (and torch behind it) is imported when a DHT starts, not on import
    import hivemind

logger = logging.getLogger(__name__)

PARENT_CHECK_PERIOD_S = 1.0

# What serving as a relay can cost a public node (p2pd's own defaults in brackets). Every relayed
# connection needs a reservation by the peer it reaches and counts against both ends' circuits, so at most
# RELAY_MAX_RESERVATIONS * RELAY_MAX_CIRCUITS_PER_PEER circuits are open, each with two copy buffers:
# 64 * 4 * 2 * 256 KiB = 128 MiB of memory at worst. Data and time limits reset a circuit (the two peers
# dial again through a fresh one); a 4 MiB batch fits many times over.
RELAY_MAX_RESERVATIONS = 64  # peers holding a relay slot, all together and per peer / IP / ASN [128]
RELAY_MAX_CIRCUITS_PER_PEER = 4  # relayed connections open at once to or from one peer [16]
RELAY_BUFFER_BYTES = 256 * 1024  # per relayed connection and direction [16 MiB]
RELAY_DATA_LIMIT_BYTES = 1 << 30  # relayed per connection and direction before it is reset [4 GiB]
RELAY_TIME_LIMIT_S = 30 * 60  # lifetime of one relayed connection [30 min]
_CLOCK_RE = re.compile(r"local time must be within .*local: ([0-9.]+), peer: ([0-9.]+)", re.S)


def load_identity(identity_path: Path) -> Identity:
    """The node's Ed25519 identity; hivemind would silently generate an RSA key at a missing path."""
    try:
        return Identity.load(identity_path)
    except FileNotFoundError:
        raise TransportError(
            "bad_identity",
            f"identity file {str(identity_path)!r} does not exist; create it with `swarmnode keygen`",
        ) from None
    except (OSError, ValueError) as exc:
        raise TransportError("bad_identity", str(exc)) from None


def check_initial_peers(initial_peers: list[str], own_peer_id: str) -> list[str]:
    """The initial peers to dial: full multiaddrs (else TransportError), this node itself left out."""
    from hivemind.utils.multiaddr import Multiaddr

    peers = []
    for addr in initial_peers:
        if "p2p-circuit" in addr:  # hivemind would take the first /p2p/ of it: the relay, not the node
            raise TransportError(
                "bad_address",
                f"initial peer {addr!r} is a relayed (/p2p-circuit/) address; give a node's direct address "
                "(a bootstrap's, or a reachable node's) instead",
            )
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
    if initial_peers and not peers:
        logger.info("all initial peers are this node itself; starting a new swarm")
    return peers


# p2pd exits when its one try at the initial peers fails; on a loaded machine (or a flaky first packet)
# that try can fail where the next succeeds: one retry, then the user's error
START_ATTEMPTS = 2
START_RETRY_DELAY_S = 2.0


def start_dht(
    swarm: SwarmConfig,
    identity_path: Path,
    initial_peers: list[str],
    *,
    client: bool,
    must_reach_initial_peers: bool,
    start_timeout_s: float,
) -> hivemind.DHT:
    """Start the DHT process (and its p2pd) and wait until it is ready; TransportError if it is not."""
    import hivemind

    from swarmnode.swarm.net.dht_guard import SignedRecordValidator, install_guard

    # p2pd gets the whole start budget (hivemind's own default is 15 s: at 32 nodes starting at once on
    # 2 cores, two of them did not make it)
    kwargs: dict[str, Any] = {"startup_timeout": start_timeout_s}
    if swarm.announce_maddrs:
        kwargs["announce_maddrs"] = list(swarm.announce_maddrs)
    if client:  # reserve a relay slot at once instead of waiting for AutoNAT to call this node private
        kwargs.update(use_auto_relay=True, force_reachability="private")
        if initial_peers:  # the peers it joins through are its relays (those that serve as one)
            kwargs["trusted_relays"] = list(initial_peers)
    elif swarm.reachability == "public":  # go-libp2p serves as a relay only when public
        kwargs["force_reachability"] = "public"
    if not must_reach_initial_peers:
        kwargs["ensure_bootstrap_success"] = False
    started = time.monotonic()
    install_relay_policy()
    connect_shared_memory_manager()

    def start_once() -> hivemind.DHT:
        dht = hivemind.DHT(
            initial_peers=initial_peers or None,
            host_maddrs=list(swarm.host_maddrs),
            identity_path=str(identity_path),
            client_mode=client,
            # hivemind's "is this identity taken" probe only parses RSA keys; ours are Ed25519
            check_if_identity_free=False,
            record_validators=[SignedRecordValidator()],
            start=True,
            await_ready=False,
            **kwargs,
        )
        try:
            dht.wait_until_ready(timeout=start_timeout_s)
            guard_request_pipe(dht, start_timeout_s)
            home = functools.partial(
                install_guard, home_swarms=(swarm.swarm_id,), work_bits=swarm.identity_work_bits
            )
            dht.run_coroutine(home, return_future=True).result(start_timeout_s)
        except BaseException as exc:
            stop_dht_process(dht)
            raise startup_error(exc, initial_peers, swarm, start_timeout_s) from None
        logger.info("DHT up in %.2f s", time.monotonic() - started)
        return dht

    for attempt in range(1, START_ATTEMPTS):
        try:
            return start_once()
        except TransportError as error:
            if error.reason != "unreachable":
                raise
            logger.warning(
                "no initial peer answered (attempt %d of %d); trying again", attempt, START_ATTEMPTS
            )
            time.sleep(START_RETRY_DELAY_S)
    return start_once()


class _SerialisedPipe:
    """The sending end of hivemind's request pipe, one whole message at a time whichever thread sends."""

    def __init__(self, pipe: Any):
        self._pipe = pipe
        self._lock = threading.Lock()

    def send(self, obj: Any) -> None:
        with self._lock:
            self._pipe.send(obj)

    def __getattr__(self, name: str) -> Any:  # close(), fileno(), ... as the pipe's
        return getattr(self._pipe, name)


def guard_request_pipe(dht: hivemind.DHT, timeout_s: float) -> None:
    """Make the node's requests to the DHT process safe at any size and from any thread (module doc):
    serialise this process's sends, and make the DHT process read each request whole (blocking)."""
    if not isinstance(dht._outer_pipe, _SerialisedPipe):
        dht._outer_pipe = _SerialisedPipe(dht._outer_pipe)
    dht.run_coroutine(_block_request_pipe, return_future=True).result(timeout_s)
    dht.run_coroutine(_quiet_abandoned_calls, return_future=True).result(timeout_s)


class AbandonedCallFilter(logging.Filter):
    """Drops the tracebacks hivemind's DHT process logs when it answers a call its caller gave up on.

    Every DHT call of the node has a deadline (net/dht.py); at the deadline the node cancels the call's
    future, which frees it here. The DHT process still finishes the call and then fails to set the result
    of a cancelled future: hivemind logs that at ERROR with a traceback ("Caught an exception when running
    a coroutine"), and asyncio again ("Task exception was never retrieved"). A deadline of ours is not an
    error of its; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, concurrent.futures.InvalidStateError) and "CANCELLED" in str(exc))


async def _quiet_abandoned_calls(_dht: Any, _node: Any) -> None:
    """Runs inside the DHT process: ``AbandonedCallFilter`` on the two loggers that report it."""
    for name in ("hivemind.dht.dht", "asyncio"):
        logging.getLogger(name).addFilter(AbandonedCallFilter())


async def _block_request_pipe(dht: Any, _node: Any) -> None:
    """Runs inside the DHT process: its request pipe's reading end back to blocking (uvloop's add_reader
    made it non-blocking; readiness still comes from the event loop, so a read waits only for the rest of
    a message being written)."""
    os.set_blocking(dht._inner_pipe.fileno(), True)


def relay_policy_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    """p2pd's flags (as hivemind's ``P2P._make_process_args`` gets them) with our relay policy added: static
    relays only where trusted relays are given, and the relay-service limits (module docstring)."""
    policy = dict(
        relayMaxReservations=RELAY_MAX_RESERVATIONS,
        relayMaxCircuits=RELAY_MAX_CIRCUITS_PER_PEER,
        relayBufferSize=RELAY_BUFFER_BYTES,
        relayDataLimit=RELAY_DATA_LIMIT_BYTES,
        relayTimeLimit=f"{RELAY_TIME_LIMIT_S}s",
    )
    if kwargs.get("trustedRelays"):
        policy["relayDiscovery"] = False
    return {**kwargs, **policy} if kwargs.get("relay") else kwargs


def install_relay_policy() -> None:
    """Make hivemind start every p2pd of this process with ``relay_policy_args`` (once; inherited by the
    forked DHT process). hivemind has no parameter for these flags, so this wraps its argument builder."""
    from hivemind.p2p import P2P

    make_args = P2P._make_process_args
    if getattr(make_args, "swarmnode_relay_policy", False):
        return

    def with_relay_policy(*args: Any, **kwargs: Any) -> list[str]:
        return make_args(*args, **relay_policy_args(kwargs))

    with_relay_policy.swarmnode_relay_policy = True  # type: ignore[attr-defined]
    P2P._make_process_args = staticmethod(with_relay_policy)


def startup_error(
    exc: BaseException, initial_peers: list[str], swarm: SwarmConfig, start_timeout_s: float
) -> TransportError:
    """What a failed DHT start means for the user: clock skew, no initial peer answering, or p2pd."""
    text = str(exc) or type(exc).__name__
    clock = _CLOCK_RE.search(text)
    if clock:
        offset = float(clock.group(1)) - float(clock.group(2))
        return TransportError(
            "clock_skew",
            f"this machine's clock is {abs(offset):.1f} s {'ahead of' if offset > 0 else 'behind'} an "
            f"initial peer's, and the DHT allows {RECORD_CLOCK_TOLERANCE_S:.0f} s. Turn on time sync "
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
        text = f"no answer within {start_timeout_s:.0f} s"
    return TransportError(
        "startup",
        f"the libp2p daemon (p2pd) did not start: {text.strip()}. Check that host_maddrs "
        f"{list(swarm.host_maddrs)} are valid addresses of this machine and the ports are free.",
    )


async def dht_stats(_dht: Any, node: Any) -> dict[str, int]:
    """Runs inside the DHT process."""
    from swarmnode.swarm.net.dht_guard import guard_stats

    return {
        "routing_table_peers": len(node.protocol.routing_table.uid_to_peer_id),
        "stored_records": len(node.protocol.storage),
        **await guard_stats(_dht, node),
    }


async def get_many(_dht: Any, node: Any, *, keys: list[str]) -> dict[str, dict[str, bytes]]:
    """Runs inside the DHT process: the newest (subkey -> value) pairs under each key, untrusted ones
    (subkey not a str, value not bytes of at most MAX_RECORD_BYTES) left out."""
    found = await node.get_many(keys, sufficient_expiration_time=float("inf"))  # latest, as get(latest=True)
    out: dict[str, dict[str, bytes]] = {}
    for key, item in found.items():
        value = getattr(item, "value", None)
        if not isinstance(value, dict):
            continue
        records = {}
        for subkey, entry in value.items():
            data = getattr(entry, "value", None)
            if isinstance(subkey, str) and isinstance(data, bytes) and len(data) <= MAX_RECORD_BYTES:
                records[subkey] = data
        out[key] = records
    return out


def check_listen_ports(host_maddrs: list[str]) -> None:
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


def dump_stacks_after(seconds: float) -> None:
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


def stop_dht_process(dht: hivemind.DHT) -> None:
    """Ask the DHT process to shut down (it stops its p2pd); terminate it if it does not within 5 s."""
    with contextlib.suppress(Exception):
        if dht.is_alive():
            dht.shutdown()
    with contextlib.suppress(Exception):
        dht.join(timeout=5.0)
        if dht.is_alive():
            dht.terminate()
            dht.join(timeout=2.0)


async def exit_with_parent(_dht: Any, node: Any, *, parent_pid: int) -> None:
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
            await asyncio.sleep(PARENT_CHECK_PERIOD_S)

    # keep a reference on the node so the task is not garbage-collected while it runs
    node._swarmnode_parent_watch = asyncio.create_task(watch())
